"""Gemma 4 text's part of the config mapping, both ways: the ModelConfig fields of a
transformers ``Gemma4TextConfig`` dict (:func:`fields_from_hf`: layer types, both RoPEs, the
full-attention layers' own heads, per-layer inputs, the MoE block beside the MLP, KV sharing
and the double-wide MLP) and the keywords export passes to that class
(:func:`hf_config_kwargs`). What we do not implement is refused in one ValueError. The keys
every family shares are read and written by :mod:`jaxrl_llm.interop.hf_config`, which asks
this module through :mod:`jaxrl_llm.models.families.registry`. The values that make a Gemma 4
are :mod:`.presets`'."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.models.config import LayerType, ModelConfig, RopeScaling
from jaxrl_llm.models.families.gemma4 import presets

#: transformers' config class export builds.
HF_CONFIG_CLASS = "Gemma4TextConfig"
#: (causal LM, sequence classifier): transformers' architecture names (transformers has no
#: Gemma 4 sequence classifier; export refuses a scalar head).
HF_ARCHITECTURES = ("Gemma4ForCausalLM", "Gemma4ForSequenceClassification")
#: The multimodal ``model_type`` whose text part is Gemma 4.
MULTIMODAL_MODEL_TYPE = "gemma4"


def _gemma4_refusals(d: Mapping[str, Any]) -> None:
    """ValueError naming the first Gemma 4 feature of ``d`` we do not implement
    (:mod:`jaxrl_llm.models.families.gemma4` lists them)."""
    act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported Gemma 4 hidden_activation {act!r}")
    if d.get("use_bidirectional_attention") == "all":
        raise ValueError("Gemma 4 use_bidirectional_attention='all' (non-causal) is not supported")


def _gemma4_global_heads(d: Mapping[str, Any], types: tuple[LayerType, ...]) -> tuple[int, int]:
    """(head dim, KV heads) of Gemma 4's full-attention layers: from transformers' serialised
    ``per_layer_config`` (what ``to_dict()`` writes) or from ``global_head_dim`` /
    ``num_global_key_value_heads`` (what the published ``config.json`` files and the config's
    constructor take; the latter only with ``attention_k_eq_v``)."""
    e, k = int(d["head_dim"]), int(d.get("num_key_value_heads") or d["num_attention_heads"])
    per_layer = d.get("per_layer_config")
    if per_layer is None:
        glob_k = d.get("num_global_key_value_heads") if d.get("attention_k_eq_v") else None
        return int(d.get("global_head_dim") or 512), int(glob_k or k)
    overrides = {int(i): dict(o) for i, o in per_layer.items()}
    found = set()
    for i, t in enumerate(types):
        o = overrides.get(i, {})
        if (t == LayerType.LOCAL and o) or set(o) - {"head_dim", "num_key_value_heads"}:
            raise ValueError(
                f"Gemma 4 per_layer_config of layer {i} ({sorted(o)}) is not supported"
            )
        if t == LayerType.GLOBAL:
            found.add((int(o.get("head_dim", e)), int(o.get("num_key_value_heads", k))))
    if len(found) > 1:
        raise ValueError(f"Gemma 4 full-attention layers of several sizes {sorted(found)}")
    return found.pop() if found else (e, k)


def fields_from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """The Gemma 4 ModelConfig fields of a transformers ``Gemma4TextConfig`` dict (``to_dict()``
    or ``config.json``): layer types (the last forced full, as transformers does), the window,
    the full-attention layers' head dim, KV heads and ``attention_k_eq_v``, both RoPEs (the
    full-attention one "proportional" or "default"), the final soft cap, KV sharing
    (``num_kv_shared_layers``) and the double-wide MLP of the shared layers (stored as
    ``intermediate_size`` = 2F, :class:`~jaxrl_llm.models.ModelConfig`).

    Raises ValueError for what we do not implement (:func:`_gemma4_refusals`).
    """
    _gemma4_refusals(d)
    n = int(d["num_hidden_layers"])
    types = tuple(LayerType(t) for t in (d.get("layer_types") or ()))
    types = (types[:-1] + (LayerType.GLOBAL,)) if types else presets.default_layer_types(n)
    head_dim, kv_heads = _gemma4_global_heads(d, types)
    rope = d.get("rope_parameters") or {}
    loc = rope.get(LayerType.LOCAL.value) or {"rope_type": "default", "rope_theta": 10_000.0}
    glob = rope.get(LayerType.GLOBAL.value) or {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1_000_000.0,
    }
    if loc.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported Gemma 4 sliding-layer rope_type {loc.get('rope_type')!r}")
    kind = glob.get("rope_type", "default")
    if kind not in ("default", "proportional"):
        raise ValueError(f"unsupported Gemma 4 full-attention rope_type {kind!r}")
    factor = float(glob.get("factor", 1.0)) if kind == "proportional" else 1.0
    proportion = float(glob.get("partial_rotary_factor") or 1.0) if kind == "proportional" else 1.0
    out: dict[str, Any] = presets.common_fields()
    # transformers' defaults: per-layer inputs of 256 from an embedding of 262144 rows.
    ple = int(d.get("hidden_size_per_layer_input", 256) or 0)
    if ple:
        rows = int(d.get("vocab_size_per_layer_input", 262_144))
        out.update(
            per_layer_input_size=ple,
            per_layer_vocab_size=None if rows == int(d["vocab_size"]) else rows,
        )
    if d.get("enable_moe_block"):
        # transformers' Gemma4ForCausalLM adds no load-balancing loss: coefficient 0.
        out.update(
            moe_beside_mlp=True,
            num_experts=int(d["num_experts"]),
            num_experts_per_tok=int(d["top_k_experts"]),
            moe_intermediate_size=int(d["moe_intermediate_size"]),
            norm_topk_prob=True,
            router_aux_loss_coef=0.0,
        )
    shared = int(d.get("num_kv_shared_layers") or 0)
    wide = bool(d.get("use_double_wide_mlp")) and shared > 0
    out.update(
        kv_shared_layers=shared,
        double_wide_mlp=wide,
        intermediate_size=int(d["intermediate_size"]) * (2 if wide else 1),
        layer_types=types,
        sliding_window=d.get("sliding_window"),
        final_logit_softcap=d.get("final_logit_softcapping"),
        tie_embeddings=bool(d.get("tie_word_embeddings", True)),
        global_head_dim=head_dim,
        global_kv_heads=kv_heads,
        global_k_eq_v=bool(d.get("attention_k_eq_v", False)),
        global_rope_proportion=proportion,
        rope_theta=float(glob.get("rope_theta", 1_000_000.0)),
        rope_local_theta=float(loc.get("rope_theta", 10_000.0)),
        rope_scaling=RopeScaling.LINEAR if factor != 1.0 else RopeScaling.NONE,
        rope_factor=factor,
    )
    return out


def hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """The keywords of transformers' ``Gemma4TextConfig`` (``Gemma4ForCausalLM``) for
    ``config`` beyond the shared ones, with its MoE block beside the MLP when
    ``moe_beside_mlp``, its per-layer inputs when ``per_layer_input_size`` and its KV sharing
    when ``kv_shared_layers``.

    Raises:
      ValueError: a config transformers' Gemma 4 cannot express (a sequence classifier, other
        values of the fields :func:`.presets.common_fields` fixes, another RoPE scaling,
        experts not beside the MLP, full-attention KV heads without ``attention_k_eq_v``).
    """
    c = config
    if c.num_labels:
        raise ValueError("Gemma 4 sequence classifiers are not supported")
    want = presets.common_fields()
    flat = c.flat()  # the helpers name fields flat
    bad = [k for k, v in want.items() if flat[k] != v]
    if bad or c.rope.scaling not in (RopeScaling.NONE, RopeScaling.LINEAR):
        raise ValueError(f"transformers' Gemma 4 has fixed {bad or ['rope_scaling']}")
    if c.is_moe and (not c.moe.beside_mlp or not c.moe.norm_topk_prob or c.moe.shared_expert_size):
        raise ValueError(
            "transformers' Gemma 4 has its experts beside the MLP (moe_beside_mlp), "
            "renormalised top-k weights and no shared expert; this config differs"
        )
    moe: dict[str, Any] = {}
    if c.is_moe:
        moe = dict(
            num_experts=c.moe.num_experts,
            top_k_experts=c.moe.num_experts_per_tok,
            moe_intermediate_size=c.moe.intermediate_size,
        )
    k_glob, e_glob = c.layer_heads(c.attn.layer_types.index(LayerType.GLOBAL))
    if k_glob != c.attn.num_kv_heads and not c.attn.global_k_eq_v:
        raise ValueError(
            "transformers' Gemma 4 gives full-attention layers their own KV heads only "
            "with attention_k_eq_v"
        )
    glob: dict[str, Any] = {
        "rope_type": "proportional",
        "partial_rotary_factor": c.rope.global_proportion,
        "rope_theta": c.rope.theta,
    }
    if c.rope.scaling == RopeScaling.LINEAR:
        glob["factor"] = c.rope.factor
    local = c.rope.theta if c.rope.local_theta is None else c.rope.local_theta
    return dict(
        intermediate_size=c.mlp.intermediate_size // 2
        if c.mlp.double_wide
        else c.mlp.intermediate_size,
        global_head_dim=e_glob,
        num_global_key_value_heads=k_glob if c.attn.global_k_eq_v else None,
        attention_k_eq_v=c.attn.global_k_eq_v,
        hidden_activation=c.mlp.activation.value,
        attention_bias=c.attn.bias,
        sliding_window=c.attn.sliding_window,
        layer_types=[t.value for t in c.attn.layer_types],
        final_logit_softcapping=c.tokens.final_logit_softcap,
        rope_parameters={
            LayerType.GLOBAL.value: glob,
            LayerType.LOCAL.value: {"rope_type": "default", "rope_theta": local},
        },
        hidden_size_per_layer_input=c.tokens.per_layer_input_size,
        vocab_size_per_layer_input=c.per_layer_vocab,
        num_kv_shared_layers=c.attn.kv_shared_layers,
        use_double_wide_mlp=c.mlp.double_wide,
        enable_moe_block=c.is_moe,
        **moe,
    )
