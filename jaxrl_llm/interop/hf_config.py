"""Mapping between transformers' model configs (``config.json`` / a ``PretrainedConfig``) and
our :class:`~jaxrl_llm.models.ModelConfig`, both ways, for every family: :func:`model_config_from_hf`
(the field mapping: the keys every family shares, then the family's own),
:func:`config_from_hf_dict` (that, plus the checks of features we do not implement, as
one-line :class:`~jaxrl_llm.errors.ModelLoadError`; Llama, Mistral, Qwen2 / 3, Gemma 2 / 3 / 4
text, Qwen3-MoE, Mixtral, Qwen3.5, gpt-oss) and :func:`hf_config_dict` (what export writes).
This module holds the keys every family shares and the dispatch; each family's own keys, both
ways, are in its folder's ``hf_config`` module (:mod:`jaxrl_llm.models.families`), asked
through its entry (:mod:`jaxrl_llm.models.families.registry`), never by its name; what they
all write alike is in :mod:`~jaxrl_llm.interop.hf_config_common`. The weights' names and
layouts are :mod:`jaxrl_llm.interop.state_dict`'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.interop.hf_config_common import config_json, hf_architectures, shared_hf_fields
from jaxrl_llm.models.config import Family, ModelConfig, RopeScaling
from jaxrl_llm.models.families.registry import MULTIMODAL_TEXT, entry_of, family_entry


def model_config_from_hf(hf: Mapping[str, Any] | Any, **overrides) -> ModelConfig:
    """A :class:`ModelConfig` from a transformers ``PretrainedConfig`` (or its ``to_dict()``),
    reading the fields every family shares and then the family's own (its entry's
    ``fields_from_hf``). :func:`config_from_hf_dict` adds the checks of features we do not implement.

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
    if d.get("model_type") in MULTIMODAL_TEXT and d.get("text_config"):
        # Gemma3 / 4, Qwen3_5(Moe) ForConditionalGeneration: the language model is the text
        # config (the multimodal model_type is the family's entry's).
        text = MULTIMODAL_TEXT[d["model_type"]]
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
        attention_bias=bool(d.get("attention_bias", False)),
        qk_norm=False,
        sliding_window=None,
        num_labels=num_labels,
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=eos,
        pad_token_id=d.get("pad_token_id"),
    )
    kwargs.update(entry_of(family).fields_from_hf(d))  # the family's own keys (its folder's)
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
    entry = family_entry(d.get("model_type", ""))
    try:
        if entry is not None and entry.check_hf is not None:
            # The Llama layout's checks; a family whose entry has none checks its own features
            # in its fields_from_hf (Gemma's activation, per-layer types and RoPE bases;
            # Qwen3.5's layer pattern and linear layers). An unknown model_type is named by
            # model_config_from_hf.
            d = entry.check_hf(d)
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
    entry = entry_of(c.family)
    try:
        kw = {**shared_hf_fields(c), **entry.hf_config_kwargs(c)}
    except ValueError as e:
        raise ModelLoadError(f"export: {e}") from None
    causal, seqcls = hf_architectures(c.family)
    if c.num_labels:
        kw["num_labels"] = c.num_labels
    hf = getattr(transformers, entry.hf_config_class)(**kw)
    return config_json(hf, c, seqcls if c.num_labels else causal, dtype)
