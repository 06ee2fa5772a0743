"""Qwen3.5 (text) as :class:`~jaxrl_llm.models.ModelConfig` values.

Qwen3.5's decoder is a hybrid (Qwen Team 2026, the Qwen3-Next / Qwen3.5 model cards): of every
four layers, three mix tokens with Gated DeltaNet linear attention (Yang, Kautz & Hatamizadeh
2024, https://arxiv.org/abs/2412.06464; :mod:`jaxrl_llm.models.gated_deltanet`) and the fourth
with softmax attention whose output is gated per head by σ(h W_gate), with q/k RMSNorm and RoPE
on the first quarter of each head's dims (``partial_rotary_factor`` 0.25). Every RMSNorm outside
the linear layers is ``x / rms(x) · (1 + w)`` in float32 (weights stored as w, initialised at
zero; :func:`jaxrl_llm.models.layer.rms_norm` with ``unit_offset``); the linear layers' output
norm is a plain-weight RMSNorm gated by SiLU(z).

Qwen3.5-MoE (``qwen3_5_moe_text``) replaces every layer's MLP by a sparse mixture of experts
(softmax router, top-k renormalised) plus a shared expert gated by σ(h W_sg).

The mapping from and to transformers' ``Qwen3_5TextConfig`` / ``Qwen3_5MoeTextConfig`` is
:mod:`jaxrl_llm.interop.hf_config_qwen3_5`'s.
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
