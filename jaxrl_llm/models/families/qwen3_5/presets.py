"""Qwen3.5 (text) sizes as :class:`~jaxrl_llm.models.ModelConfig` field dicts: the fields
every Qwen3.5 shares, tiny random-init configs for tests (dense and MoE) and two published
sizes for planning. Imports only the options (a leaf for the config,
:mod:`jaxrl_llm.models.families.facts`).

The published sizes are the defaults of transformers' (5.23.0) ``Qwen3_5TextConfig`` (its
docstring: "the Qwen3.5-9B style configuration") and ``Qwen3_5MoeTextConfig`` ("the
Qwen3.5-35B-A3B style configuration"): vocabulary 248,320, head dim 256 with RoPE on a quarter
of it, linear attention with 16 key heads and 32 value heads of 128, conv width 4. RoPE base
1e7, as in THUDM/slime's Qwen3.5-27B training script (transformers' classes default to
10,000); the base changes no memory.
"""

from __future__ import annotations

from typing import Any

from jaxrl_llm.models.options import Family, LayerType


def hybrid_layer_types(num_layers: int, interval: int = 4) -> tuple[LayerType, ...]:
    """``interval − 1`` LINEAR layers then one GLOBAL layer, repeated (transformers' default
    ``layer_types`` for Qwen3.5 from ``full_attention_interval``)."""
    return tuple(
        LayerType.GLOBAL if (i + 1) % interval == 0 else LayerType.LINEAR for i in range(num_layers)
    )


def common_fields(family: Family = Family.QWEN3_5) -> dict[str, Any]:
    """The ModelConfig fields every Qwen3.5 text model (dense or MoE) shares (transformers'
    classes fix them)."""
    return dict(
        family=Family(family),
        rms_norm_unit_offset=True,
        qk_norm=True,
        attn_output_gate=True,
    )


def qwen3_5_tiny_fields(family: Family = Family.QWEN3_5) -> dict[str, Any]:
    """A tiny random Qwen3.5 for tests: 4 layers (3 linear, 1 full attention), odd sizes; the
    MoE variant with 8 experts of width 40, top-2 (renormalised), a shared expert of width 56."""
    moe: dict[str, Any] = {}
    if Family(family) == Family.QWEN3_5_MOE:
        moe = dict(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=40,
            norm_topk_prob=True,
            shared_expert_size=56,
        )
    return dict(
        common_fields(family),
        **moe,
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_layers=4,
        num_heads=3,
        num_kv_heads=1,
        head_dim=16,
        partial_rotary_factor=0.25,
        layer_types=hybrid_layer_types(4),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel=4,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    )


def tiny_fields() -> dict[str, Any]:
    """The tiny dense Qwen3.5 (:func:`qwen3_5_tiny_fields`)."""
    return qwen3_5_tiny_fields(Family.QWEN3_5)


def moe_tiny_fields() -> dict[str, Any]:
    """The tiny Qwen3.5-MoE (:func:`qwen3_5_tiny_fields`)."""
    return qwen3_5_tiny_fields(Family.QWEN3_5_MOE)


def _published(family: Family, num_layers: int, **sizes) -> dict[str, Any]:
    """A published Qwen3.5 text decoder: three Gated DeltaNet layers then one attention layer,
    repeated, with the sizes both transformers classes default to (module docstring)."""
    return dict(
        common_fields(family),
        vocab_size=248320,
        num_layers=num_layers,
        head_dim=256,
        max_position_embeddings=32768,
        rope_theta=10_000_000.0,
        rms_norm_eps=1e-6,
        partial_rotary_factor=0.25,
        layer_types=hybrid_layer_types(num_layers),
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel=4,
        **sizes,
    )


def qwen3_5_9b_fields() -> dict[str, Any]:
    """Qwen3.5-9B: 32 layers (24 linear, 8 attention), D 4096, MLP 12288, 16 heads / 4 KV
    heads, untied; 8.95B parameters."""
    return _published(
        Family.QWEN3_5,
        32,
        hidden_size=4096,
        intermediate_size=12288,
        num_heads=16,
        num_kv_heads=4,
    )


def qwen3_5_35b_a3b_fields() -> dict[str, Any]:
    """Qwen3.5-35B-A3B: 40 layers (30 linear, 10 attention), D 2048, 16 heads / 2 KV heads,
    256 experts of width 512, top-8 renormalised, a shared expert of 512."""
    return _published(
        Family.QWEN3_5_MOE,
        40,
        hidden_size=2048,
        intermediate_size=512,  # no dense MLP: the expert width (as interop.hf_config maps it)
        num_heads=16,
        num_kv_heads=2,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_size=512,
        norm_topk_prob=True,
    )
