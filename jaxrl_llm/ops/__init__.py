"""Small numerical building blocks shared by every layer: masked reductions, whitening,
per-token log-probabilities and entropies (from logits, or chunked from hidden states)."""

from jaxrl_llm.ops.logprobs import (
    entropy_from_hidden,
    entropy_from_logits,
    logprobs_and_entropy_from_hidden,
    token_logprobs,
    token_logprobs_from_hidden,
)
from jaxrl_llm.ops.masked import (
    masked_count,
    masked_mean,
    masked_std,
    masked_sum,
    masked_var,
    masked_whiten,
    safe_divide,
)

__all__ = [
    "entropy_from_hidden",
    "entropy_from_logits",
    "logprobs_and_entropy_from_hidden",
    "masked_count",
    "masked_mean",
    "masked_std",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "safe_divide",
    "token_logprobs",
    "token_logprobs_from_hidden",
]
