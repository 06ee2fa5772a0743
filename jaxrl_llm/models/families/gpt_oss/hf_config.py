"""gpt-oss's part of the config mapping, both ways: the fields of transformers'
``GptOssConfig`` that are gpt-oss's own (:func:`fields_from_hf`) and the keywords export
passes to it (:func:`hf_config_kwargs`). The keys every family shares (sizes, norm ε, special
tokens, the RoPE base and factor) are read and written by :mod:`jaxrl_llm.interop.hf_config`,
which asks this module through :mod:`jaxrl_llm.models.families.registry`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.models.config import Activation, LayerType, ModelConfig, RopeScaling

#: transformers' config class export builds.
HF_CONFIG_CLASS = "GptOssConfig"
#: (causal LM, sequence classifier): transformers' architecture names.
HF_ARCHITECTURES = ("GptOssForCausalLM", "GptOssForSequenceClassification")


def fields_from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`~jaxrl_llm.models.ModelConfig` fields of a ``GptOssConfig`` dict (its
    ``to_dict()`` or ``config.json``) beyond the shared ones.

    Raises:
      ValueError: a feature we do not implement (another activation, YaRN's ``mscale`` /
        ``mscale_all_dim`` without an ``attention_factor``), naming the key.
    """
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"gpt-oss hidden_act={act!r} is not supported (only 'silu')")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    mscale = rope.get("mscale") or rope.get("mscale_all_dim")
    if mscale and rope.get("attention_factor") is None:
        raise ValueError(
            "YaRN's mscale / mscale_all_dim are not supported; give rope_parameters."
            "attention_factor instead"
        )
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types") or [
        LayerType.LOCAL.value if i % 2 == 0 else LayerType.GLOBAL.value for i in range(n)
    ]
    bias = bool(d.get("attention_bias", True))
    fields: dict[str, Any] = dict(
        layer_types=tuple(LayerType(t) for t in types),
        sliding_window=d.get("sliding_window"),
        attention_bias=bias,
        attention_out_bias=bias,
        attention_sinks=True,
        expert_bias=True,
        mlp_activation=Activation.CLAMPED_SWIGLU,
        swiglu_alpha=float(d.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(d.get("swiglu_limit", 7.0)),
        num_experts=int(d["num_local_experts"] if "num_local_experts" in d else d["num_experts"]),
        num_experts_per_tok=int(d["num_experts_per_tok"]),
        moe_intermediate_size=int(d["intermediate_size"]),
        norm_topk_prob=True,
        router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)),
    )
    if rope.get("rope_type", rope.get("type")) == RopeScaling.YARN.value:
        fields.update(
            rope_beta_fast=float(rope.get("beta_fast") or 32.0),
            rope_beta_slow=float(rope.get("beta_slow") or 1.0),
            rope_truncate=bool(rope.get("truncate", True)),
            rope_attention_factor=rope.get("attention_factor"),
        )
    return fields


def hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """The keywords of transformers' ``GptOssConfig`` for ``config`` beyond the shared ones.

    Raises:
      ValueError: a config transformers' gpt-oss cannot express (no sinks or expert biases,
        another activation, q/k/v bias without the output bias or back, q/k norms, top-k
        weights not renormalised, another RoPE scaling than YaRN or none).
    """
    c = config
    problems = []
    if not (c.attn.sinks and c.moe.expert_bias and c.is_moe and c.moe.norm_topk_prob):
        problems.append("needs attention_sinks, expert_bias, experts and norm_topk_prob")
    if c.mlp.activation != Activation.CLAMPED_SWIGLU:
        problems.append(f"has the clamped SwiGLU, not {c.mlp.activation.value}")
    if c.attn.bias != c.attn.out_bias or c.attn.qk_norm:
        problems.append("has q/k/v and output biases together and no q/k norm")
    if c.rope.scaling not in (RopeScaling.YARN, RopeScaling.NONE):
        problems.append(f"has YaRN or plain RoPE, not {c.rope.scaling.value}")
    if c.moe.intermediate_size != c.mlp.intermediate_size:
        problems.append("has experts of width intermediate_size")
    if problems:
        raise ValueError("transformers' gpt-oss " + "; ".join(problems))
    rope: dict[str, Any] = {"rope_type": c.rope.scaling.value, "rope_theta": c.rope.theta}
    if c.rope.scaling == RopeScaling.YARN:
        rope.update(
            factor=c.rope.factor,
            beta_fast=c.rope.beta_fast,
            beta_slow=c.rope.beta_slow,
            truncate=c.rope.truncate,
            original_max_position_embeddings=c.rope.original_max_position,
        )
        if c.rope.attention_factor is not None:
            rope["attention_factor"] = c.rope.attention_factor
    types = c.attn.layer_types or (LayerType.GLOBAL,) * c.num_layers
    return dict(
        intermediate_size=c.moe.intermediate_size,
        num_local_experts=c.moe.num_experts,
        num_experts_per_tok=c.moe.num_experts_per_tok,
        router_aux_loss_coef=c.moe.router_aux_loss_coef,
        sliding_window=c.attn.sliding_window,
        layer_types=[t.value for t in types],
        rope_parameters=rope,
        attention_bias=c.attn.bias,
        swiglu_alpha=c.mlp.swiglu_alpha,
        swiglu_limit=c.mlp.swiglu_limit,
        hidden_act="silu",
    )
