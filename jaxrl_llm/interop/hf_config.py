"""Mapping between transformers' model configs (``config.json`` / a ``PretrainedConfig``) and
our :class:`~jaxrl_llm.models.ModelConfig`, both ways: :func:`config_from_hf_dict` (Llama,
Mistral, Qwen2 / 3, Gemma 2 / 3 text, Qwen3-MoE, Mixtral; anything else is refused in one
line) and :func:`hf_config_dict` (what export writes). The weights' names and layouts are
:mod:`jaxrl_llm.interop.state_dict`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.models import gemma, moe
from jaxrl_llm.models.config import Family, ModelConfig, RopeScaling

_SUPPORTED_ACT = ("silu", "swish")
# model_type values of Gemma 2, Gemma 3 text and the multimodal Gemma 3 (its text part).
_GEMMA_TYPES = ("gemma2", "gemma3_text", "gemma3")


def config_from_hf_dict(
    hf: Mapping[str, Any] | Any, *, source: str = "config", **overrides
) -> ModelConfig:
    """A :class:`ModelConfig` from a transformers config (object or ``config.json`` dict).

    Wraps :meth:`ModelConfig.from_hf_config` and additionally rejects features our model
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
    if d.get("model_type") in _GEMMA_TYPES:
        # Gemma's activation, per-layer types and RoPE bases are read by models.gemma.
        try:
            return ModelConfig.from_hf_config(d, **overrides)
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
        return ModelConfig.from_hf_config(d, **overrides)
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
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        hidden_act="silu",
        tie_word_embeddings=c.tie_embeddings,
        rope_theta=c.rope_theta,
        rope_scaling=None if c.rope_scaling == RopeScaling.NONE else rope,
        bos_token_id=c.bos_token_id,
        pad_token_id=c.pad_token_id,
        eos_token_id=(
            None
            if not c.eos_token_ids
            else c.eos_token_ids[0]
            if len(c.eos_token_ids) == 1
            else list(c.eos_token_ids)
        ),
    )
    if c.family in moe.MOE_FAMILIES:
        try:
            kw.update(moe.hf_config_kwargs(c))
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
    hf = cls(**kw)
    d = hf.to_dict()
    d.pop("quantization_config", None)
    d.pop("_name_or_path", None)
    d["architectures"] = [seqcls if c.num_labels else causal]
    d["model_type"] = c.family.value
    d["torch_dtype"] = dtype or c.param_dtype
    if "dtype" in d:
        d["dtype"] = dtype or c.param_dtype
    return d


def _gemma_hf_config_dict(config: ModelConfig, *, dtype: str | None) -> dict[str, Any]:
    """:func:`hf_config_dict` for Gemma 2 / Gemma 3 text (``Gemma3ForCausalLM``)."""
    import transformers

    c = config
    if c.num_labels:
        raise ModelLoadError("export: Gemma sequence classifiers are not supported")
    cls = transformers.Gemma2Config if c.family == Family.GEMMA2 else transformers.Gemma3TextConfig
    try:
        gemma_kw = gemma.hf_config_kwargs(c)
    except ValueError as e:
        raise ModelLoadError(f"export: {e}") from None
    eos = list(c.eos_token_ids)
    hf = cls(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_embeddings,
        attention_bias=c.attention_bias,
        bos_token_id=c.bos_token_id,
        pad_token_id=c.pad_token_id,
        eos_token_id=None if not eos else eos[0] if len(eos) == 1 else eos,
        **gemma_kw,
    )
    d = hf.to_dict()
    d.pop("quantization_config", None)
    d.pop("_name_or_path", None)
    d["architectures"] = [_architectures(c.family)[0]]
    d["model_type"] = c.family.value
    d["torch_dtype"] = dtype or c.param_dtype
    if "dtype" in d:
        d["dtype"] = dtype or c.param_dtype
    return d


def _architectures(family: Family) -> tuple[str, str]:
    from jaxrl_llm.models.config import HF_ARCHITECTURES

    return HF_ARCHITECTURES[family]
