"""Small numerical building blocks shared by every layer: masked reductions, whitening,
per-token log-probabilities and entropies (from logits, or chunked from hidden states)."""

from jaxrl_llm.ops.logprobs import entropy_from_hidden
from jaxrl_llm.ops.logprobs import entropy_from_logits
from jaxrl_llm.ops.logprobs import logprobs_and_entropy_from_hidden
from jaxrl_llm.ops.logprobs import token_logprobs
from jaxrl_llm.ops.logprobs import token_logprobs_from_hidden
from jaxrl_llm.ops.masked import masked_count
from jaxrl_llm.ops.masked import masked_mean
from jaxrl_llm.ops.masked import masked_std
from jaxrl_llm.ops.masked import masked_sum
from jaxrl_llm.ops.masked import masked_var
from jaxrl_llm.ops.masked import masked_whiten
from jaxrl_llm.ops.masked import safe_divide

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
