"""Gemma 2 / Gemma 3 text's part of the config mapping, both ways: the ModelConfig fields of a
transformers ``Gemma2Config`` / ``Gemma3TextConfig`` dict (:func:`fields_from_hf`, read on top
of the keys every family shares in :func:`jaxrl_llm.interop.hf_config.model_config_from_hf`)
and the keywords export passes to those classes (:func:`hf_config_kwargs`), asked through
:mod:`jaxrl_llm.models.families.registry`. The values that make a Gemma are :mod:`.presets`'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.models.config import Family, LayerType, ModelConfig, RopeScaling
from jaxrl_llm.models.families.gemma import presets

#: transformers' config classes export builds, per family.
HF_CONFIG_CLASSES = {Family.GEMMA2: "Gemma2Config", Family.GEMMA3: "Gemma3TextConfig"}
#: (causal LM, sequence classifier): transformers' architecture names, per family.
HF_ARCHITECTURES = {
    Family.GEMMA2: ("Gemma2ForCausalLM", "Gemma2ForSequenceClassification"),
    Family.GEMMA3: ("Gemma3ForCausalLM", "Gemma3TextForSequenceClassification"),
}
#: The multimodal ``model_type`` whose text part is Gemma 3.
MULTIMODAL_MODEL_TYPE = "gemma3"
#: transformers' class of that multimodal model (export names it).
MULTIMODAL_ARCHITECTURE = "Gemma3ForConditionalGeneration"


def _gemma_rope_fields(rope: Mapping[str, Any] | None, prefix: str) -> dict[str, Any]:
    """RoPE fields from one transformers rope-parameters dict (``rope_type``, ``factor``)."""
    rope = rope or {}
    kind = RopeScaling(rope.get("rope_type", rope.get("type", "default")))
    if kind not in (RopeScaling.NONE, RopeScaling.LINEAR):
        raise ValueError(f"unsupported {prefix} rope scaling {kind.value!r} for a Gemma model")
    return dict(rope_scaling=kind, rope_factor=float(rope.get("factor", 1.0)))


def fields_from_hf(d: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """The Gemma-specific ModelConfig fields of a transformers ``Gemma2Config`` /
    ``Gemma3TextConfig`` dict (``to_dict()`` or ``config.json``), read on top of the fields
    every family shares.

    Raises ValueError for what we do not implement (bidirectional attention, a non-default
    RoPE on local layers, an activation other than tanh-GELU).
    """
    family = Family(family)
    act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported Gemma hidden_activation {act!r}")
    if d.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=true (EmbeddingGemma) is not supported")
    n = int(d["num_hidden_layers"])
    period = 2 if family == Family.GEMMA2 else int(d.get("sliding_window_pattern", 6))
    types = tuple(
        LayerType(t) for t in (d.get("layer_types") or ())
    ) or presets.pattern_layer_types(n, period)
    out: dict[str, Any] = presets.common_fields(family)
    out.update(
        layer_types=types,
        sliding_window=d.get("sliding_window"),
        query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or d["head_dim"]),
        attn_logit_softcap=d.get("attn_logit_softcapping"),
        final_logit_softcap=d.get("final_logit_softcapping"),
        tie_embeddings=bool(d.get("tie_word_embeddings", True)),
    )
    rope = d.get("rope_parameters") or {}
    if family == Family.GEMMA3 and LayerType.GLOBAL.value in rope:  # one dict per layer type
        glob, loc = rope[LayerType.GLOBAL.value] or {}, rope.get(LayerType.LOCAL.value) or {}
        if _gemma_rope_fields(loc, "local")["rope_scaling"] != RopeScaling.NONE:
            raise ValueError("a scaled RoPE on Gemma 3 local layers is not supported")
        out.update(_gemma_rope_fields(glob, "global"))
        out["rope_theta"] = float(glob.get("rope_theta", 1_000_000.0))
        out["rope_local_theta"] = float(loc.get("rope_theta", 10_000.0))
    else:  # Gemma 2, or an older Gemma 3 config.json (rope_theta, rope_local_base_freq)
        out.update(_gemma_rope_fields(d.get("rope_scaling") or rope, "global"))
        out["rope_theta"] = float(d.get("rope_theta") or rope.get("rope_theta") or 10_000.0)
        if family == Family.GEMMA3:
            out["rope_local_theta"] = float(d.get("rope_local_base_freq", 10_000.0))
    return out


def gemma2_fields_from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`fields_from_hf` of a ``Gemma2Config`` dict."""
    return fields_from_hf(d, Family.GEMMA2)


def gemma3_fields_from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`fields_from_hf` of a ``Gemma3TextConfig`` dict."""
    return fields_from_hf(d, Family.GEMMA3)


def hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """Keyword arguments of transformers' ``Gemma2Config`` / ``Gemma3TextConfig``
    (``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM``) for ``config`` beyond the shared ones (the
    inverse of :func:`fields_from_hf`).

    Raises ValueError when the config is not expressible in transformers' Gemma (a sequence
    classifier, untied or without post-norms, ...).
    """
    c = config
    if c.num_labels:
        raise ValueError("Gemma sequence classifiers are not supported")
    want = presets.common_fields(c.family)
    flat = c.flat()  # the helpers name fields flat
    bad = [k for k, v in want.items() if k != "tie_embeddings" and flat[k] != v]
    if bad:
        raise ValueError(f"transformers' {c.family.value} has fixed {bad}; this config differs")
    if c.attn.query_pre_attn_scalar is not None and c.attn.query_pre_attn_scalar % 1:
        raise ValueError(f"query_pre_attn_scalar={c.attn.query_pre_attn_scalar} is not an integer")
    kw: dict[str, Any] = dict(
        intermediate_size=c.mlp.intermediate_size,
        attention_bias=c.attn.bias,
        hidden_activation=c.mlp.activation.value,
        layer_types=[t.value for t in c.attn.layer_types] or None,
        sliding_window=c.attn.sliding_window,
        # transformers' config type is int; Gemma's scalars are whole numbers.
        query_pre_attn_scalar=int(c.attn.query_pre_attn_scalar or c.attn.head_dim),
        attn_logit_softcapping=c.attn.logit_softcap,
        final_logit_softcapping=c.tokens.final_logit_softcap,
    )
    glob: dict[str, Any] = {"rope_type": c.rope.scaling.value, "rope_theta": c.rope.theta}
    if c.rope.scaling == RopeScaling.LINEAR:
        glob["factor"] = c.rope.factor
    elif c.rope.scaling != RopeScaling.NONE:
        raise ValueError(f"Gemma export supports default or linear RoPE, not {c.rope.scaling}")
    if c.family == Family.GEMMA3:
        local = c.rope.theta if c.rope.local_theta is None else c.rope.local_theta
        kw["rope_parameters"] = {
            LayerType.GLOBAL.value: glob,
            LayerType.LOCAL.value: {"rope_type": "default", "rope_theta": local},
        }
    else:
        if c.rope.local_theta not in (None, c.rope.theta):
            raise ValueError("transformers' Gemma 2 has one RoPE base for all layers")
        kw["rope_parameters"] = glob
    return kw
