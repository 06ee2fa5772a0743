"""Qwen3-MoE and Mixtral sizes as :class:`~jaxrl_llm.models.ModelConfig` field dicts: their
tiny random-init configs for tests, the Llama-layout tiny sizes
(:func:`jaxrl_llm.models.families.llama.presets.tiny_shared_fields`) with 8 experts, top-2.
Imports only the options and the Llama presets (a leaf for the config)."""

from __future__ import annotations

import functools
from typing import Any

from jaxrl_llm.models.families.llama.presets import tiny_shared_fields
from jaxrl_llm.models.options import Family

# The tiny MoE: 8 experts of width 40, top-2.
_TINY_EXPERTS: dict[str, Any] = dict(num_experts=8, num_experts_per_tok=2)

#: What each family's tiny config sets beyond the shared sizes (Qwen3-MoE without
#: renormalisation, as its default; Mixtral renormalised, its experts as wide as the MLP).
TINY_OWN_FIELDS: dict[Family, dict[str, Any]] = {
    Family.QWEN3_MOE: dict(
        qk_norm=True, **_TINY_EXPERTS, moe_intermediate_size=40, norm_topk_prob=False
    ),
    Family.MIXTRAL: dict(**_TINY_EXPERTS, moe_intermediate_size=None, norm_topk_prob=True),
}


def tiny_fields(family: Family) -> dict[str, Any]:
    """The fields of ``family``'s tiny random-init config."""
    return {**tiny_shared_fields(family), **TINY_OWN_FIELDS[family]}


#: Family -> its tiny preset (for :data:`jaxrl_llm.models.families.facts.TINY_FIELDS`).
TINY_PRESETS = {f: functools.partial(tiny_fields, f) for f in TINY_OWN_FIELDS}
