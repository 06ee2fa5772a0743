"""Mapping between transformers' model configs (``config.json`` / a ``PretrainedConfig``) and
our :class:`~jaxrl_llm.models.ModelConfig`, both ways, for every family: :func:`model_config_from_hf`
(the field mapping: the keys every family shares, then Gemma 2 / 3 / 4's, Qwen3.5's and the MoE
families' own), :func:`config_from_hf_dict` (that, plus the checks of features we do not
implement, as one-line :class:`~jaxrl_llm.errors.ModelLoadError`; Llama, Mistral, Qwen2 / 3,
Gemma 2 / 3 / 4 text, Qwen3-MoE, Mixtral, Qwen3.5) and :func:`hf_config_dict` (what export
writes). ``models/`` holds what a family computes and its presets; the transformers field names
are all here. The weights' names and layouts are :mod:`jaxrl_llm.interop.state_dict`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.models import gemma, gemma4, moe, qwen3_5
from jaxrl_llm.models.config import HF_ARCHITECTURES, Family, LayerType, ModelConfig, RopeScaling

_SUPPORTED_ACT = ("silu", "swish")
# model_type values of Gemma 2, Gemma 3 / 4 text and the multimodal Gemma 3 / 4 (its text part).
_GEMMA_TYPES = ("gemma2", "gemma3_text", "gemma3", "gemma4_text", "gemma4")
# model_type values of Qwen3.5 text and the multimodal Qwen3.5 (its text part).
_QWEN3_5_TYPES = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe")
# The multimodal model_type -> its text part's family.
_MULTIMODAL_TEXT = {
    "gemma3": Family.GEMMA3,
    "qwen3_5": Family.QWEN3_5,
    "qwen3_5_moe": Family.QWEN3_5_MOE,
    "gemma4": Family.GEMMA4,
}


def model_config_from_hf(hf: Mapping[str, Any] | Any, **overrides) -> ModelConfig:
    """A :class:`ModelConfig` from a transformers ``PretrainedConfig`` (or its ``to_dict()``),
    reading the fields every family shares and then the family's own (Gemma 2 / 3, Qwen3-MoE,
    Mixtral). :func:`config_from_hf_dict` adds the checks of features we do not implement.

    Args:
      hf: a ``PretrainedConfig`` or its ``to_dict()`` / ``config.json`` dict.
      **overrides: ModelConfig fields to replace (e.g. ``param_dtype``).

    Returns:
      The ModelConfig.

    Raises:
      ValueError: naming the architecture when it is not a supported family, or a family
        feature we do not implement; KeyError: a required key is missing.
    """
    d: Mapping[str, Any] = hf if isinstance(hf, Mapping) else hf.to_dict()
    if d.get("model_type") in _MULTIMODAL_TEXT and d.get("text_config"):
        # Gemma3 / Qwen3_5(Moe) ForConditionalGeneration: the language model is the text config.
        text = _MULTIMODAL_TEXT[d["model_type"]]
        d = {"architectures": d.get("architectures"), **d["text_config"]}
        d["model_type"] = text.value
    model_type = d.get("model_type")
    try:
        family = Family(model_type)
    except ValueError:
        raise ValueError(
            f"unsupported architecture model_type={model_type!r} "
            f"(architectures={d.get('architectures')}); supported: "
            f"{[f.value for f in Family]}"
        ) from None
    rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
    if rope_type not in {r.value for r in RopeScaling}:
        raise ValueError(
            f"unsupported rope scaling {rope_type!r}; supported: {[r.value for r in RopeScaling]}"
        )
    rope_theta = d.get("rope_theta")
    if rope_theta is None:
        rope_theta = rope.get("rope_theta", 10000.0) if rope else 10000.0
    eos = d.get("eos_token_id")
    eos = () if eos is None else (tuple(eos) if isinstance(eos, (list, tuple)) else (eos,))
    sliding = d.get("sliding_window") if family in (Family.MISTRAL, Family.MIXTRAL) else None
    if family in (Family.QWEN2, Family.QWEN3, Family.QWEN3_MOE) and d.get("use_sliding_window"):
        sliding = d.get("sliding_window")
    num_labels = 0
    archs = d.get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in archs):
        num_labels = int(d.get("num_labels", len(d.get("id2label", {}) or {0: 0})))
    kwargs = dict(
        family=family,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        # Qwen3.5-MoE has no dense MLP: its expert width stands in.
        intermediate_size=d["intermediate_size"]
        if "intermediate_size" in d
        else d["moe_intermediate_size"],
        num_layers=d["num_hidden_layers"],
        num_heads=d["num_attention_heads"],
        num_kv_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
        head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
        max_position_embeddings=d.get("max_position_embeddings", 8192),
        rope_theta=float(rope_theta),
        rope_scaling=RopeScaling(rope_type),
        rope_factor=float(rope.get("factor", 1.0)) if rope else 1.0,
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)) if rope else 1.0,
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)) if rope else 4.0,
        rope_original_max_position=int(rope.get("original_max_position_embeddings", 8192))
        if rope
        else 8192,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=bool(d.get("attention_bias", family == Family.QWEN2)),
        qk_norm=family in (Family.QWEN3, Family.QWEN3_MOE),
        sliding_window=sliding,
        num_labels=num_labels,
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=eos,
        pad_token_id=d.get("pad_token_id"),
    )
    if family in (Family.GEMMA2, Family.GEMMA3):
        kwargs.update(_gemma_fields_from_hf(d, family))
    if family == Family.GEMMA4:
        kwargs.update(_gemma4_fields_from_hf(d))
    if family in moe.MOE_FAMILIES:
        kwargs.update(_moe_fields_from_hf(d, family))
    if family in (Family.QWEN3_5, Family.QWEN3_5_MOE):
        kwargs.update(_qwen3_5_fields_from_hf(d, family))
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


def config_from_hf_dict(
    hf: Mapping[str, Any] | Any, *, source: str = "config", **overrides
) -> ModelConfig:
    """A :class:`ModelConfig` from a transformers config (object or ``config.json`` dict).

    Wraps :func:`model_config_from_hf` and additionally rejects features our model
    does not implement (non-SiLU MLP, MLP bias, per-layer sliding windows), so a model that
    would load but compute something different fails loudly instead.

    Args:
      hf: a ``PretrainedConfig`` or its ``to_dict()``.
      source: how to name the input in error messages (a path).
      **overrides: ModelConfig fields to replace (e.g. ``param_dtype``).

    Returns:
      The ModelConfig.

    Raises:
      ModelLoadError: unsupported architecture or feature, naming the source and the key.
    """
    d = dict(hf) if isinstance(hf, Mapping) else hf.to_dict()
    if d.get("model_type") in _GEMMA_TYPES + _QWEN3_5_TYPES:
        # Gemma's activation, per-layer types and RoPE bases: _gemma_fields_from_hf;
        # Qwen3.5's layer pattern and linear layers: _qwen3_5_fields_from_hf.
        try:
            return model_config_from_hf(d, **overrides)
        except (ValueError, KeyError, TypeError) as e:
            msg = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise ModelLoadError(f"{source}: {msg}") from None
    act = d.get("hidden_act", "silu")
    if act not in _SUPPORTED_ACT:
        raise ModelLoadError(
            f"{source}: hidden_act={act!r} is not supported; allowed: {list(_SUPPORTED_ACT)}"
        )
    if d.get("mlp_bias"):
        raise ModelLoadError(
            f"{source}: mlp_bias=true is not supported (Llama-family models without MLP bias only)"
        )
    layer_types = set(d.get("layer_types") or ())
    if len(layer_types) > 1:
        raise ModelLoadError(
            f"{source}: per-layer attention types (layer_types="
            f"{sorted(layer_types)}) are not supported; all layers must match"
        )
    if layer_types == {"full_attention"} and "sliding_window" not in overrides:
        overrides = {**overrides, "sliding_window": None}
    archs = d.get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in archs):
        num_labels = int(d.get("num_labels", len(d.get("id2label") or {}) or 1))
        if num_labels != 1:
            raise ModelLoadError(
                f"{source}: a sequence classifier with num_labels={num_labels} "
                f"is not supported; only scalar heads (num_labels=1)"
            )
        # A transformers sequence classifier has no output projection; treating it as tied
        # means our tree has no lm_head either (the unembedding is then unused).
        d["num_labels"] = 1
        d["tie_word_embeddings"] = True
    try:
        return model_config_from_hf(d, **overrides)
    except (ValueError, KeyError, TypeError) as e:
        msg = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        raise ModelLoadError(f"{source}: {msg}") from None


def hf_config_dict(config: ModelConfig, *, dtype: str | None = None) -> dict[str, Any]:
    """The ``config.json`` dict transformers needs to rebuild this model.

    Built through transformers' own config class of the family, so every key has the
    spelling the installed transformers expects. Never contains ``quantization_config``.

    Args:
      config: our model config. ``num_labels == 1`` gives a ``*ForSequenceClassification``
        config; otherwise ``*ForCausalLM``.
      dtype: stored weight dtype ('float32' | 'bfloat16'); defaults to ``config.param_dtype``.

    Returns:
      A JSON-serialisable dict (with ``architectures``, ``model_type``, ``torch_dtype``).
    """
    import transformers

    c = config
    if c.family in (Family.GEMMA2, Family.GEMMA3):
        return _gemma_hf_config_dict(c, dtype=dtype)
    if c.family in (Family.QWEN3_5, Family.QWEN3_5_MOE):
        return _qwen3_5_hf_config_dict(c, dtype=dtype)
    if c.family == Family.GEMMA4:
        return _gemma4_hf_config_dict(c, dtype=dtype)
    if c.is_moe and c.family not in moe.MOE_FAMILIES:
        raise ModelLoadError(
            f"export: a {c.family.value} config with experts has no transformers class "
            f"(use family 'qwen3_moe' or 'mixtral')"
        )
    cls = {
        Family.LLAMA: transformers.LlamaConfig,
        Family.MISTRAL: transformers.MistralConfig,
        Family.QWEN2: transformers.Qwen2Config,
        Family.QWEN3: transformers.Qwen3Config,
        Family.QWEN3_MOE: transformers.Qwen3MoeConfig,
        Family.MIXTRAL: transformers.MixtralConfig,
    }[c.family]
    rope: dict[str, Any] = {"rope_type": c.rope_scaling.value}
    if c.rope_scaling == RopeScaling.LINEAR:
        rope["factor"] = c.rope_factor
    elif c.rope_scaling == RopeScaling.LLAMA3:
        rope.update(
            factor=c.rope_factor,
            low_freq_factor=c.rope_low_freq_factor,
            high_freq_factor=c.rope_high_freq_factor,
            original_max_position_embeddings=c.rope_original_max_position,
        )
    kw: dict[str, Any] = dict(
        **_shared_hf_fields(c),
        intermediate_size=c.intermediate_size,
        hidden_act="silu",
        rope_theta=c.rope_theta,
        rope_scaling=None if c.rope_scaling == RopeScaling.NONE else rope,
    )
    if c.family in moe.MOE_FAMILIES:
        try:
            kw.update(_moe_hf_config_kwargs(c))
        except ValueError as e:
            raise ModelLoadError(f"export: {e}") from None
    if c.family in (Family.LLAMA, Family.QWEN3, Family.QWEN3_MOE):
        kw["attention_bias"] = c.attention_bias
    elif c.family == Family.QWEN2 and not c.attention_bias:
        raise ModelLoadError(
            "export: transformers' Qwen2 always has q/k/v biases; this config "
            "has attention_bias=False (use family 'llama' or 'qwen3')"
        )
    if c.family in (Family.MISTRAL, Family.MIXTRAL):
        kw["sliding_window"] = c.sliding_window
    elif c.family in (Family.QWEN2, Family.QWEN3, Family.QWEN3_MOE):
        kw["use_sliding_window"] = c.sliding_window is not None
        kw["sliding_window"] = c.sliding_window
        kw["max_window_layers"] = 0 if c.sliding_window is not None else c.num_layers
    if c.family == Family.LLAMA and c.qk_norm:
        raise ModelLoadError(
            "export: transformers' Llama has no q/k norm; this config has "
            "qk_norm=True (use family 'qwen3')"
        )
    causal, seqcls = _architectures(c.family)
    if c.num_labels:
        kw["num_labels"] = c.num_labels
    return _config_json(cls(**kw), c, seqcls if c.num_labels else causal, dtype)


def _shared_hf_fields(c: ModelConfig) -> dict[str, Any]:
    """The ``config.json`` keys every family's transformers config takes alike: sizes, norm
    epsilon, tied embeddings and the special token ids (one eos id as an int, several as a
    list)."""
    eos = list(c.eos_token_ids)
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_embeddings,
        bos_token_id=c.bos_token_id,
        pad_token_id=c.pad_token_id,
        eos_token_id=None if not eos else eos[0] if len(eos) == 1 else eos,
    )


def _config_json(hf: Any, config: ModelConfig, architecture: str, dtype: str | None):
    """The ``config.json`` dict of a transformers config object built for ``config``: its
    ``to_dict()`` without quantization or a source path, with the architecture, model type and
    stored dtype."""
    d = hf.to_dict()
    d.pop("quantization_config", None)
    d.pop("_name_or_path", None)
    d["architectures"] = [architecture]
    d["model_type"] = config.family.value
    d["torch_dtype"] = dtype or config.param_dtype
    if "dtype" in d:
        d["dtype"] = dtype or config.param_dtype
    return d


def _gemma_hf_config_dict(config: ModelConfig, *, dtype: str | None) -> dict[str, Any]:
    """:func:`hf_config_dict` for Gemma 2 / Gemma 3 text (``Gemma3ForCausalLM``)."""
    import transformers

    c = config
    if c.num_labels:
        raise ModelLoadError("export: Gemma sequence classifiers are not supported")
    cls = transformers.Gemma2Config if c.family == Family.GEMMA2 else transformers.Gemma3TextConfig
    try:
        gemma_kw = _gemma_hf_config_kwargs(c)
    except ValueError as e:
        raise ModelLoadError(f"export: {e}") from None
    hf = cls(
        **_shared_hf_fields(c),
        intermediate_size=c.intermediate_size,
        attention_bias=c.attention_bias,
        **gemma_kw,
    )
    return _config_json(hf, c, _architectures(c.family)[0], dtype)


def _qwen3_5_hf_config_dict(config: ModelConfig, *, dtype: str | None) -> dict[str, Any]:
    """:func:`hf_config_dict` for Qwen3.5 text (``Qwen3_5ForCausalLM``) and Qwen3.5-MoE text
    (``Qwen3_5MoeForCausalLM``)."""
    import transformers

    c = config
    if c.num_labels:
        raise ModelLoadError("export: Qwen3.5 sequence classifiers are not supported")
    want = qwen3_5.common_fields(c.family)
    bad = [k for k, v in want.items() if getattr(c, k) != v]
    if bad or c.attention_bias or c.rope_scaling != RopeScaling.NONE:
        raise ModelLoadError(
            f"export: transformers' Qwen3.5 has fixed {bad or ['attention_bias', 'rope_scaling']}; "
            f"this config differs"
        )
    if c.family == Family.QWEN3_5_MOE:
        if not c.norm_topk_prob or not c.shared_expert_size:
            raise ModelLoadError(
                "export: transformers' Qwen3.5-MoE renormalises the top-k weights and has a "
                "shared expert; this config differs"
            )
        cls: Any = transformers.Qwen3_5MoeTextConfig
        sizes: dict[str, Any] = dict(
            num_experts=c.num_experts,
            num_experts_per_tok=c.num_experts_per_tok,
            moe_intermediate_size=c.moe_intermediate_size,
            shared_expert_intermediate_size=c.shared_expert_size,
            router_aux_loss_coef=c.router_aux_loss_coef,
        )
    else:
        cls, sizes = transformers.Qwen3_5TextConfig, dict(intermediate_size=c.intermediate_size)
    hf = cls(
        **_shared_hf_fields(c),
        **sizes,
        hidden_act="silu",
        rope_parameters={
            "rope_type": "default",
            "rope_theta": c.rope_theta,
            "partial_rotary_factor": c.partial_rotary_factor,
        },
        linear_conv_kernel_dim=c.linear_conv_kernel,
        linear_key_head_dim=c.linear_key_head_dim,
        linear_value_head_dim=c.linear_value_head_dim,
        linear_num_key_heads=c.linear_num_key_heads,
        linear_num_value_heads=c.linear_num_value_heads,
        layer_types=[t.value for t in c.layer_types],
    )
    return _config_json(hf, c, _architectures(c.family)[0], dtype)


def _architectures(family: Family) -> tuple[str, str]:
    return HF_ARCHITECTURES[family]


# ----- the families' own fields ----------------------------------------------------------


def _gemma_rope_fields(rope: Mapping[str, Any] | None, prefix: str) -> dict[str, Any]:
    """RoPE fields from one transformers rope-parameters dict (``rope_type``, ``factor``)."""
    rope = rope or {}
    kind = RopeScaling(rope.get("rope_type", rope.get("type", "default")))
    if kind not in (RopeScaling.NONE, RopeScaling.LINEAR):
        raise ValueError(f"unsupported {prefix} rope scaling {kind.value!r} for a Gemma model")
    return dict(rope_scaling=kind, rope_factor=float(rope.get("factor", 1.0)))


def _gemma_fields_from_hf(d: Mapping[str, Any], family: Family) -> dict[str, Any]:
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
    types = tuple(LayerType(t) for t in (d.get("layer_types") or ())) or gemma.pattern_layer_types(
        n, period
    )
    out: dict[str, Any] = gemma.common_fields(family)
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


def _gemma_hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """Keyword arguments of transformers' ``Gemma2Config`` / ``Gemma3TextConfig`` for the
    Gemma-specific fields of ``config`` (the inverse of :func:`_gemma_fields_from_hf`).

    Raises ValueError when the config is not expressible in transformers' Gemma (e.g. untied
    or without post-norms).
    """
    c = config
    want = gemma.common_fields(c.family)
    bad = [k for k, v in want.items() if k != "tie_embeddings" and getattr(c, k) != v]
    if bad:
        raise ValueError(f"transformers' {c.family.value} has fixed {bad}; this config differs")
    if c.query_pre_attn_scalar is not None and c.query_pre_attn_scalar % 1:
        raise ValueError(f"query_pre_attn_scalar={c.query_pre_attn_scalar} is not an integer")
    kw: dict[str, Any] = dict(
        hidden_activation=c.mlp_activation.value,
        layer_types=[t.value for t in c.layer_types] or None,
        sliding_window=c.sliding_window,
        # transformers' config type is int; Gemma's scalars are whole numbers.
        query_pre_attn_scalar=int(c.query_pre_attn_scalar or c.head_dim),
        attn_logit_softcapping=c.attn_logit_softcap,
        final_logit_softcapping=c.final_logit_softcap,
    )
    glob: dict[str, Any] = {"rope_type": c.rope_scaling.value, "rope_theta": c.rope_theta}
    if c.rope_scaling == RopeScaling.LINEAR:
        glob["factor"] = c.rope_factor
    elif c.rope_scaling != RopeScaling.NONE:
        raise ValueError(f"Gemma export supports default or linear RoPE, not {c.rope_scaling}")
    if c.family == Family.GEMMA3:
        local = c.rope_theta if c.rope_local_theta is None else c.rope_local_theta
        kw["rope_parameters"] = {
            LayerType.GLOBAL.value: glob,
            LayerType.LOCAL.value: {"rope_type": "default", "rope_theta": local},
        }
    else:
        if c.rope_local_theta not in (None, c.rope_theta):
            raise ValueError("transformers' Gemma 2 has one RoPE base for all layers")
        kw["rope_parameters"] = glob
    return kw


def _gemma4_refusals(d: Mapping[str, Any]) -> None:
    """ValueError naming the first Gemma 4 feature of ``d`` we do not implement
    (:mod:`jaxrl_llm.models.gemma4` lists them)."""
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


def _gemma4_fields_from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
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
    types = (types[:-1] + (LayerType.GLOBAL,)) if types else gemma4.default_layer_types(n)
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
    out: dict[str, Any] = gemma4.common_fields()
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


def _gemma4_hf_config_dict(config: ModelConfig, *, dtype: str | None) -> dict[str, Any]:
    """:func:`hf_config_dict` for Gemma 4 text (``Gemma4ForCausalLM``), with its MoE block
    beside the MLP when ``moe_beside_mlp``, its per-layer inputs when
    ``per_layer_input_size`` and its KV sharing when ``kv_shared_layers``."""
    import transformers

    c = config
    if c.num_labels:
        raise ModelLoadError("export: Gemma 4 sequence classifiers are not supported")
    want = gemma4.common_fields()
    bad = [k for k, v in want.items() if getattr(c, k) != v]
    if bad or c.rope_scaling not in (RopeScaling.NONE, RopeScaling.LINEAR):
        raise ModelLoadError(f"export: transformers' Gemma 4 has fixed {bad or ['rope_scaling']}")
    if c.is_moe and (not c.moe_beside_mlp or not c.norm_topk_prob or c.shared_expert_size):
        raise ModelLoadError(
            "export: transformers' Gemma 4 has its experts beside the MLP (moe_beside_mlp), "
            "renormalised top-k weights and no shared expert; this config differs"
        )
    moe: dict[str, Any] = {}
    if c.is_moe:
        moe = dict(
            num_experts=c.num_experts,
            top_k_experts=c.num_experts_per_tok,
            moe_intermediate_size=c.moe_intermediate_size,
        )
    k_glob, e_glob = c.layer_heads(c.layer_types.index(LayerType.GLOBAL))
    if k_glob != c.num_kv_heads and not c.global_k_eq_v:
        raise ModelLoadError(
            "export: transformers' Gemma 4 gives full-attention layers their own KV heads only "
            "with attention_k_eq_v"
        )
    glob: dict[str, Any] = {
        "rope_type": "proportional",
        "partial_rotary_factor": c.global_rope_proportion,
        "rope_theta": c.rope_theta,
    }
    if c.rope_scaling == RopeScaling.LINEAR:
        glob["factor"] = c.rope_factor
    local = c.rope_theta if c.rope_local_theta is None else c.rope_local_theta
    fields: dict[str, Any] = dict(  # as a dict: transformers' typed __init__ lists fewer keys
        **_shared_hf_fields(c),
        intermediate_size=c.intermediate_size // 2 if c.double_wide_mlp else c.intermediate_size,
        global_head_dim=e_glob,
        num_global_key_value_heads=k_glob if c.global_k_eq_v else None,
        attention_k_eq_v=c.global_k_eq_v,
        hidden_activation=c.mlp_activation.value,
        attention_bias=c.attention_bias,
        sliding_window=c.sliding_window,
        layer_types=[t.value for t in c.layer_types],
        final_logit_softcapping=c.final_logit_softcap,
        rope_parameters={
            LayerType.GLOBAL.value: glob,
            LayerType.LOCAL.value: {"rope_type": "default", "rope_theta": local},
        },
        hidden_size_per_layer_input=c.per_layer_input_size,
        vocab_size_per_layer_input=c.per_layer_vocab,
        num_kv_shared_layers=c.kv_shared_layers,
        use_double_wide_mlp=c.double_wide_mlp,
        enable_moe_block=c.is_moe,
        **moe,
    )
    hf = transformers.Gemma4TextConfig(**fields)
    return _config_json(hf, c, _architectures(c.family)[0], dtype)


def _qwen3_5_fields_from_hf(d: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """The Qwen3.5-specific ModelConfig fields of a transformers ``Qwen3_5TextConfig`` /
    ``Qwen3_5MoeTextConfig`` dict: the layer pattern (``layer_types``, or
    ``full_attention_interval``), the Gated DeltaNet sizes, the partial rotary factor; for
    the MoE variant the experts (softmax top-k, renormalised) and the shared expert.

    Raises ValueError for an activation other than SiLU or a RoPE other than the default (the
    multimodal position sections, ``mrope_section``, reduce to plain RoPE on text, where the
    three position ids are equal).
    """
    act = d.get("hidden_act", "silu")
    if act not in _SUPPORTED_ACT:
        raise ValueError(f"unsupported Qwen3.5 hidden_act {act!r}")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"unsupported Qwen3.5 rope_type {rope.get('rope_type')!r}")
    if d.get("attention_bias"):
        raise ValueError("Qwen3.5 with attention_bias=true (biased q/k/v/o projections)")
    n = int(d["num_hidden_layers"])
    types = tuple(LayerType(t) for t in (d.get("layer_types") or ()))
    types = types or qwen3_5.hybrid_layer_types(n, int(d.get("full_attention_interval", 4)))
    factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25))
    out: dict[str, Any] = qwen3_5.common_fields(family)
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


def _moe_fields_from_hf(d: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """ModelConfig fields of a Qwen3-MoE / Mixtral transformers config dict.

    Raises:
      ValueError: a Qwen3-MoE config that mixes dense and sparse layers (``decoder_sparse_step``
        ≠ 1 or ``mlp_only_layers``), or Mixtral's ``router_jitter_noise`` > 0 (training-time
        multiplicative noise on the router input, not implemented).
    """
    if family == Family.QWEN3_MOE:
        step = int(d.get("decoder_sparse_step") or 1)
        dense = list(d.get("mlp_only_layers") or [])
        if step != 1 or dense:
            raise ValueError(
                f"Qwen3-MoE with dense layers (decoder_sparse_step={step}, "
                f"mlp_only_layers={dense}) is not supported: every layer must be sparse "
                f"(decoder_sparse_step=1, mlp_only_layers=[])"
            )
        return dict(
            # config.json says num_experts; transformers >= 5's to_dict num_local_experts.
            num_experts=int(d["num_experts"] if "num_experts" in d else d["num_local_experts"]),
            num_experts_per_tok=int(d["num_experts_per_tok"]),
            moe_intermediate_size=int(d["moe_intermediate_size"]),
            norm_topk_prob=bool(d.get("norm_topk_prob", False)),
            router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)),
        )
    if family == Family.MIXTRAL:
        jitter = float(d.get("router_jitter_noise") or 0.0)
        if jitter > 0:
            raise ValueError(
                f"Mixtral router_jitter_noise={jitter} is not supported (only 0.0, the "
                f"released models' value)"
            )
        return dict(
            num_experts=int(d["num_local_experts"]),
            num_experts_per_tok=int(d["num_experts_per_tok"]),
            moe_intermediate_size=int(d["intermediate_size"]),
            norm_topk_prob=True,
            router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)),
        )
    raise ValueError(f"{family.value} is not a mixture-of-experts family")


def _moe_hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """The MoE keywords of transformers' ``Qwen3MoeConfig`` / ``MixtralConfig`` for ``config``.

    Raises:
      ValueError: a Mixtral config without ``norm_topk_prob`` (transformers' Mixtral always
        renormalises) or whose expert width differs from ``intermediate_size``.
    """
    c = config
    if c.family == Family.QWEN3_MOE:
        return dict(
            num_experts=c.num_experts,
            num_experts_per_tok=c.num_experts_per_tok,
            moe_intermediate_size=c.moe_intermediate_size,
            norm_topk_prob=c.norm_topk_prob,
            router_aux_loss_coef=c.router_aux_loss_coef,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if c.family == Family.MIXTRAL:
        if not c.norm_topk_prob:
            raise ValueError("transformers' Mixtral always renormalises the top-k weights")
        if c.moe_intermediate_size != c.intermediate_size:
            raise ValueError(
                f"Mixtral's experts have width intermediate_size={c.intermediate_size}, "
                f"this config has moe_intermediate_size={c.moe_intermediate_size}"
            )
        return dict(
            num_local_experts=c.num_experts,
            num_experts_per_tok=c.num_experts_per_tok,
            router_aux_loss_coef=c.router_aux_loss_coef,
            router_jitter_noise=0.0,
        )
    raise ValueError(f"{c.family.value} is not a mixture-of-experts family")
