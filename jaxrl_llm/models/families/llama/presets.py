"""Llama, Mistral, Qwen2 and Qwen3 sizes as :class:`~jaxrl_llm.models.ModelConfig` field
dicts: the tiny random-init configs for tests (:func:`tiny_fields`; the MoE families'
(:mod:`jaxrl_llm.models.families.llama_moe.presets`) start from the same sizes) and
SmolLM2-135M. Imports only the options (a leaf for the config,
:mod:`jaxrl_llm.models.families.facts`)."""

from __future__ import annotations

import functools
from typing import Any

from jaxrl_llm.models.options import Family

#: What each family's tiny config sets beyond :func:`tiny_shared_fields`.
TINY_OWN_FIELDS: dict[Family, dict[str, Any]] = {
    Family.LLAMA: dict(tie_embeddings=True),
    Family.MISTRAL: {},
    Family.QWEN2: dict(attention_bias=True),
    Family.QWEN3: dict(qk_norm=True),
}


def tiny_shared_fields(family: Family) -> dict[str, Any]:
    """The sizes every Llama-layout family's tiny random config shares (odd, distinct sizes for
    unit tests): V 97, D 48, F 80, 2 layers, 3 heads / 1 KV head of 16, untied, no biases."""
    return dict(
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


def tiny_fields(family: Family) -> dict[str, Any]:
    """The fields of ``family``'s tiny random-init config: :func:`tiny_shared_fields` with
    :data:`TINY_OWN_FIELDS`."""
    return {**tiny_shared_fields(family), **TINY_OWN_FIELDS[family]}


#: Family -> its tiny preset (for :data:`jaxrl_llm.models.families.facts.TINY_FIELDS`).
TINY_PRESETS = {f: functools.partial(tiny_fields, f) for f in TINY_OWN_FIELDS}


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
