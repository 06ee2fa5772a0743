"""The fields of :class:`~jaxrl_llm.models.config.ModelConfig`'s presets, as keyword dicts:
:meth:`~jaxrl_llm.models.config.ModelConfig.tiny` (each family's tiny test model) and
:meth:`~jaxrl_llm.models.config.ModelConfig.smollm2_135m` build a config from them and the
caller's overrides. The Gemma 2 / 3 and family-folder presets are their own
modules'; this picks among them.
"""

from __future__ import annotations

from typing import Any

from jaxrl_llm.models.families.facts import TINY_FIELDS
from jaxrl_llm.models.options import Family

# The tiny MoE: 8 experts of width 40, top-2.
_TINY_EXPERTS: dict[str, Any] = dict(num_experts=8, num_experts_per_tok=2)

#: What each Llama-like family's tiny config sets beyond :func:`tiny_preset_fields`' shared
#: sizes (Qwen3-MoE without renormalisation, as its default; Mixtral renormalised, its experts
#: as wide as the MLP).
TINY_OWN_FIELDS: dict[Family, dict[str, Any]] = {
    Family.LLAMA: dict(tie_embeddings=True),
    Family.MISTRAL: {},
    Family.QWEN2: dict(attention_bias=True),
    Family.QWEN3: dict(qk_norm=True),
    Family.QWEN3_MOE: dict(
        qk_norm=True, **_TINY_EXPERTS, moe_intermediate_size=40, norm_topk_prob=False
    ),
    Family.MIXTRAL: dict(**_TINY_EXPERTS, moe_intermediate_size=None, norm_topk_prob=True),
}


def tiny_preset_fields(family: Family) -> dict[str, Any]:
    """The fields of ``family``'s tiny random-init config (odd, distinct sizes for unit tests):
    a family folder's or Gemma 2 / 3's own preset, else the shared Llama-like sizes with
    :data:`TINY_OWN_FIELDS`."""
    if family in TINY_FIELDS:  # a family folder's own preset (models/families/), Gemma 2 / 3
        return TINY_FIELDS[family]()
    shared: dict[str, Any] = dict(
        family=family,
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_layers=2,
        num_heads=3,
        num_kv_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_embeddings=False,
        attention_bias=False,
        qk_norm=False,
    )
    return {**shared, **TINY_OWN_FIELDS[family]}


def smollm2_135m_fields() -> dict[str, Any]:
    """SmolLM2-135M(-Instruct)'s fields: 30 layers, D=576, 9 heads / 3 KV heads, tied, V=49152."""
    return dict(
        family=Family.LLAMA,
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
        pad_token_id=2,
    )
