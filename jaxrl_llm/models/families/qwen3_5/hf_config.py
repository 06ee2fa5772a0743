"""Qwen3.5 and Qwen3.5-MoE text's part of the config mapping, both ways: the ModelConfig fields
of a transformers ``Qwen3_5TextConfig`` / ``Qwen3_5MoeTextConfig`` dict
(:func:`fields_from_hf`: the layer pattern, the Gated DeltaNet sizes, the partial rotary
factor, the experts) and the keywords export passes to those classes
(:func:`hf_config_kwargs`). The keys every family shares are read and written by
:mod:`jaxrl_llm.interop.hf_config`, which asks this module through
:mod:`jaxrl_llm.models.families.registry`. The values that make a Qwen3.5 are
:mod:`.presets`'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.models.config import Family, LayerType, ModelConfig, RopeScaling
from jaxrl_llm.models.families.qwen3_5 import presets

#: transformers' config classes export builds, per family.
HF_CONFIG_CLASSES = {
    Family.QWEN3_5: "Qwen3_5TextConfig",
    Family.QWEN3_5_MOE: "Qwen3_5MoeTextConfig",
}
#: (causal LM, sequence classifier): transformers' architecture names, per family
#: (transformers has no Qwen3.5-MoE text sequence classifier; export refuses a scalar head).
HF_ARCHITECTURES = {
    Family.QWEN3_5: ("Qwen3_5ForCausalLM", "Qwen3_5TextForSequenceClassification"),
    Family.QWEN3_5_MOE: ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForSequenceClassification"),
}
#: The multimodal ``model_type`` whose text part each family is.
MULTIMODAL_MODEL_TYPES = {Family.QWEN3_5: "qwen3_5", Family.QWEN3_5_MOE: "qwen3_5_moe"}

# transformers' names of SiLU (the Llama layout's, families.llama.hf_config.SUPPORTED_ACT).
_SILU = ("silu", "swish")


def fields_from_hf(d: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """The Qwen3.5-specific ModelConfig fields of a transformers ``Qwen3_5TextConfig`` /
    ``Qwen3_5MoeTextConfig`` dict: the layer pattern (``layer_types``, or
    ``full_attention_interval``), the Gated DeltaNet sizes, the partial rotary factor; for
    the MoE variant the experts (softmax top-k, renormalised) and the shared expert.

    Raises ValueError for an activation other than SiLU or a RoPE other than the default (the
    multimodal position sections, ``mrope_section``, reduce to plain RoPE on text, where the
    three position ids are equal).
    """
    act = d.get("hidden_act", "silu")
    if act not in _SILU:
        raise ValueError(f"unsupported Qwen3.5 hidden_act {act!r}")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"unsupported Qwen3.5 rope_type {rope.get('rope_type')!r}")
    if d.get("attention_bias"):
        raise ValueError("Qwen3.5 with attention_bias=true (biased q/k/v/o projections)")
    n = int(d["num_hidden_layers"])
    types = tuple(LayerType(t) for t in (d.get("layer_types") or ()))
    types = types or presets.hybrid_layer_types(n, int(d.get("full_attention_interval", 4)))
    factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25))
    out: dict[str, Any] = presets.common_fields(family)
    if family == Family.QWEN3_5_MOE:
        out.update(
            num_experts=int(d["num_experts"]),
            num_experts_per_tok=int(d["num_experts_per_tok"]),
            moe_intermediate_size=int(d["moe_intermediate_size"]),
            shared_expert_size=int(d["shared_expert_intermediate_size"]),
            norm_topk_prob=True,
            router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)),
        )
    out.update(
        layer_types=types,
        partial_rotary_factor=float(factor),
        linear_num_key_heads=int(d["linear_num_key_heads"]),
        linear_num_value_heads=int(d["linear_num_value_heads"]),
        linear_key_head_dim=int(d["linear_key_head_dim"]),
        linear_value_head_dim=int(d["linear_value_head_dim"]),
        linear_conv_kernel=int(d["linear_conv_kernel_dim"]),
    )
    return out


def dense_fields_from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`fields_from_hf` of a ``Qwen3_5TextConfig`` dict."""
    return fields_from_hf(d, Family.QWEN3_5)


def moe_fields_from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`fields_from_hf` of a ``Qwen3_5MoeTextConfig`` dict."""
    return fields_from_hf(d, Family.QWEN3_5_MOE)


def hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """The keywords of transformers' ``Qwen3_5TextConfig`` (``Qwen3_5ForCausalLM``) or
    ``Qwen3_5MoeTextConfig`` (``Qwen3_5MoeForCausalLM``) for ``config`` beyond the shared ones.

    Raises:
      ValueError: a config transformers' Qwen3.5 cannot express (a sequence classifier, other
        values of the fields :func:`.presets.common_fields` fixes, q/k/v biases, RoPE scaling;
        for the MoE variant top-k weights not renormalised or no shared expert).
    """
    c = config
    if c.num_labels:
        raise ValueError("Qwen3.5 sequence classifiers are not supported")
    want = presets.common_fields(c.family)
    flat = c.flat()  # the helpers name fields flat
    bad = [k for k, v in want.items() if flat[k] != v]
    if bad or c.attn.bias or c.rope.scaling != RopeScaling.NONE:
        raise ValueError(
            f"transformers' Qwen3.5 has fixed {bad or ['attention_bias', 'rope_scaling']}; "
            f"this config differs"
        )
    if c.family == Family.QWEN3_5_MOE:
        if not c.moe.norm_topk_prob or not c.moe.shared_expert_size:
            raise ValueError(
                "transformers' Qwen3.5-MoE renormalises the top-k weights and has a "
                "shared expert; this config differs"
            )
        sizes: dict[str, Any] = dict(
            num_experts=c.moe.num_experts,
            num_experts_per_tok=c.moe.num_experts_per_tok,
            moe_intermediate_size=c.moe.intermediate_size,
            shared_expert_intermediate_size=c.moe.shared_expert_size,
            router_aux_loss_coef=c.moe.router_aux_loss_coef,
        )
    else:
        sizes = dict(intermediate_size=c.mlp.intermediate_size)
    return dict(
        **sizes,
        hidden_act="silu",
        rope_parameters={
            "rope_type": "default",
            "rope_theta": c.rope.theta,
            "partial_rotary_factor": c.rope.partial_rotary_factor,
        },
        linear_conv_kernel_dim=c.linear.conv_kernel,
        linear_key_head_dim=c.linear.key_head_dim,
        linear_value_head_dim=c.linear.value_head_dim,
        linear_num_key_heads=c.linear.num_key_heads,
        linear_num_value_heads=c.linear.num_value_heads,
        layer_types=[t.value for t in c.attn.layer_types],
    )
