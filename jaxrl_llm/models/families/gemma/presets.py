"""Gemma 2 and Gemma 3 (text) sizes as :class:`~jaxrl_llm.models.ModelConfig` field dicts:
the fields that make a Gemma, tiny random-init configs for tests and Gemma 3 270M. Imports only
the options (a leaf for the config, :mod:`jaxrl_llm.models.families.facts`)."""

from __future__ import annotations

from typing import Any

from jaxrl_llm.models.options import Activation, Family, LayerType

_LOCAL, _GLOBAL = LayerType.LOCAL, LayerType.GLOBAL


def pattern_layer_types(num_layers: int, period: int) -> tuple[LayerType, ...]:
    """``period − 1`` LOCAL layers then one GLOBAL layer, repeated (transformers' default
    ``layer_types`` for Gemma 3 with period 6 and Gemma 2 with period 2)."""
    return tuple(_GLOBAL if (i + 1) % period == 0 else _LOCAL for i in range(num_layers))


def common_fields(family: Family) -> dict[str, Any]:
    """The ModelConfig fields every Gemma 2 / Gemma 3 model shares (what makes a config a Gemma;
    transformers' Gemma classes fix them)."""
    return dict(
        family=family,
        rms_norm_unit_offset=True,
        post_norms=True,
        mlp_activation=Activation.GELU_TANH,
        scale_embeddings=True,
        tie_embeddings=True,
        qk_norm=family == Family.GEMMA3,
    )


def tiny_fields(family: Family) -> dict[str, Any]:
    """ModelConfig fields of a tiny random Gemma 2 / Gemma 3 for unit tests: odd distinct sizes,
    3 layers so that both layer types occur, window 4, a query scalar ≠ head_dim and, for
    Gemma 2, the soft caps."""
    family = Family(family)
    fields: dict[str, Any] = dict(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_layers=3,
        num_heads=3,
        num_kv_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        sliding_window=4,
        query_pre_attn_scalar=24.0,
        **common_fields(family),
    )
    if family == Family.GEMMA2:
        fields.update(
            layer_types=pattern_layer_types(3, 2), attn_logit_softcap=50.0, final_logit_softcap=30.0
        )
    else:
        fields.update(layer_types=pattern_layer_types(3, 2), rope_theta=1e6, rope_local_theta=1e4)
    return fields


def gemma3_270m_fields() -> dict[str, Any]:
    """ModelConfig fields of Gemma 3 270M (google/gemma-3-270m, and the Q4_K_M GGUF of the
    ``gemma3-270m`` alias): 18 layers, five local (window 512) per global, D=640, F=2048,
    4 heads / 1 KV head of E=256, V=262144, RoPE 1M global / 10k local."""
    return dict(
        **common_fields(Family.GEMMA3),
        vocab_size=262144,
        hidden_size=640,
        intermediate_size=2048,
        num_layers=18,
        num_heads=4,
        num_kv_heads=1,
        head_dim=256,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rope_local_theta=10_000.0,
        rms_norm_eps=1e-6,
        sliding_window=512,
        layer_types=pattern_layer_types(18, 6),
        query_pre_attn_scalar=256.0,
        bos_token_id=2,
        eos_token_ids=(1, 106),
        pad_token_id=0,
    )
