"""What :class:`~jaxrl_llm.models.ModelConfig` asks a family kept in a folder
(:mod:`jaxrl_llm.models.families`) without comparing family names: its tiny preset and whether
its RMSNorm multiplies by the weight in float32. A leaf table: it imports only the options and
the families' preset modules (which import only the options)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxrl_llm.models.families.gpt_oss import presets as gpt_oss
from jaxrl_llm.models.options import Family

#: Family -> the fields of its tiny random-init config for unit tests.
TINY_FIELDS: dict[Family, Callable[[], dict[str, Any]]] = {
    Family.GPT_OSS: gpt_oss.tiny_fields,
}

#: Families whose RMSNorm computes ``cast(w · x̂)`` in float32 (transformers' Gemma 4 and
#: gpt-oss norms), not ``w · cast(x̂)`` (Llama).
FLOAT32_NORM_FAMILIES: frozenset[Family] = frozenset({Family.GEMMA4, Family.GPT_OSS})
