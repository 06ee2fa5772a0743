"""Rollouts: jitted prefill + ``lax.while_loop`` decode with a KV cache, the prompt prefilled
once per group of G samples, exact log-probs of the sampled tokens.

Token data is batch-major ``[B, T]``; a rollout of B prompts × G samples has N = B·G rows,
prompt-major (groups are consecutive rows of G). Log-probs follow the losses' convention
log softmax(logits / τ)[token] (``jaxrl_llm.ops.token_logprobs(..., temperature=τ)``).
"""

from jaxrl_llm.sampling.config import DEFAULT_BUCKETS, SamplingConfig, bucket_length
from jaxrl_llm.sampling.decode import DecodeState, decode, init_decode_state, prefill, trace_counts
from jaxrl_llm.sampling.engine import PagedEngine
from jaxrl_llm.sampling.engine_rows import Row
from jaxrl_llm.sampling.filters import (
    filtered_logits,
    min_p_filter,
    row_keys,
    select_tokens,
    top_k_filter,
    top_p_filter,
)
from jaxrl_llm.sampling.paged import PageAllocator, PageTable, pages_for
from jaxrl_llm.sampling.paged_generate import ROLLOUT_ENGINES, generate_paged
from jaxrl_llm.sampling.slots import (
    SlotState,
    admit_rows,
    cast_for_rollout,
    cow_copy,
    decode_chunk,
    engine_trace_counts,
    extend_row,
    store_prompts,
)
from jaxrl_llm.sampling.static_generate import (
    Rollout,
    generate,
    pad_prompts,
    rollout,
    stop_token_ids,
)
from jaxrl_llm.sampling.text import decode_completions, encode_prompts, generate_text

__all__ = [
    "ROLLOUT_ENGINES",
    "PagedEngine",
    "Row",
    "SlotState",
    "admit_rows",
    "cast_for_rollout",
    "cow_copy",
    "decode_chunk",
    "engine_trace_counts",
    "extend_row",
    "generate_paged",
    "store_prompts",
    "PageAllocator",
    "PageTable",
    "pages_for",
    "DEFAULT_BUCKETS",
    "DecodeState",
    "Rollout",
    "SamplingConfig",
    "bucket_length",
    "decode",
    "decode_completions",
    "encode_prompts",
    "filtered_logits",
    "generate",
    "generate_text",
    "init_decode_state",
    "min_p_filter",
    "pad_prompts",
    "prefill",
    "rollout",
    "row_keys",
    "select_tokens",
    "stop_token_ids",
    "top_k_filter",
    "top_p_filter",
    "trace_counts",
]
