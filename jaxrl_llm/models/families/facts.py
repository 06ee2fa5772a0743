"""What :class:`~jaxrl_llm.models.ModelConfig` asks a family without comparing family names:
its tiny preset, whether its RMSNorm multiplies by the weight in float32, whether it needs
experts, whether its stack must be a hybrid. A leaf table: it imports only the options and the
families' preset modules (which import only the options, and the Llama presets)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from jaxrl_llm.models.families.gemma import presets as gemma
from jaxrl_llm.models.families.gemma4 import presets as gemma4
from jaxrl_llm.models.families.gpt_oss import presets as gpt_oss
from jaxrl_llm.models.families.llama import presets as llama
from jaxrl_llm.models.families.llama_moe import presets as llama_moe
from jaxrl_llm.models.families.qwen3_5 import presets as qwen3_5
from jaxrl_llm.models.options import Family

#: Family -> the fields of its tiny random-init config for unit tests.
TINY_FIELDS: dict[Family, Callable[[], dict[str, Any]]] = {
    **llama.TINY_PRESETS,
    **llama_moe.TINY_PRESETS,
    Family.GEMMA2: functools.partial(gemma.tiny_fields, Family.GEMMA2),
    Family.GEMMA3: functools.partial(gemma.tiny_fields, Family.GEMMA3),
    Family.GEMMA4: gemma4.tiny_fields,
    Family.GPT_OSS: gpt_oss.tiny_fields,
    Family.QWEN3_5: qwen3_5.tiny_fields,
    Family.QWEN3_5_MOE: qwen3_5.moe_tiny_fields,
}

#: Families whose RMSNorm computes ``cast(w · x̂)`` in float32 (transformers' Gemma 4 and
#: gpt-oss norms), not ``w · cast(x̂)`` (Llama).
FLOAT32_NORM_FAMILIES: frozenset[Family] = frozenset({Family.GEMMA4, Family.GPT_OSS})

#: Families whose every layer has a mixture of experts (``num_experts > 0``).
EXPERT_FAMILIES: frozenset[Family] = frozenset(
    {Family.QWEN3_MOE, Family.MIXTRAL, Family.QWEN3_5_MOE, Family.GPT_OSS}
)

#: Families whose stack is a hybrid: LINEAR (Gated DeltaNet) entries in ``layer_types``.
HYBRID_FAMILIES: frozenset[Family] = frozenset({Family.QWEN3_5, Family.QWEN3_5_MOE})
