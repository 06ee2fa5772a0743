"""Llama, Mistral, Qwen2 and Qwen3's part of the config mapping, both ways: the ModelConfig
fields of their transformers config dicts beyond the keys every family shares
(:func:`fields_from_hf`: the sliding window, q/k/v biases, q/k norm), the checks of what the
shared layer does not implement (:func:`check_hf`, run by
:func:`jaxrl_llm.interop.config_from_hf_dict`), and the keywords export passes to
``LlamaConfig`` / ``MistralConfig`` / ``Qwen2Config`` / ``Qwen3Config``
(:func:`hf_config_kwargs`), asked through :mod:`jaxrl_llm.models.families.registry`.

The MoE families (:mod:`jaxrl_llm.models.families.llama_moe`: Qwen3-MoE is Qwen3's layout with
experts, Mixtral Mistral's) read and write these same keys through :func:`fields_from_hf` and
:func:`layout_hf_config_kwargs`, which therefore also know those two families' rows."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from jaxrl_llm.models.config import Family, ModelConfig, RopeScaling

#: transformers' config classes export builds, per family.
HF_CONFIG_CLASSES = {
    Family.LLAMA: "LlamaConfig",
    Family.MISTRAL: "MistralConfig",
    Family.QWEN2: "Qwen2Config",
    Family.QWEN3: "Qwen3Config",
}
#: (causal LM, sequence classifier): transformers' architecture names, per family.
HF_ARCHITECTURES = {
    Family.LLAMA: ("LlamaForCausalLM", "LlamaForSequenceClassification"),
    Family.MISTRAL: ("MistralForCausalLM", "MistralForSequenceClassification"),
    Family.QWEN2: ("Qwen2ForCausalLM", "Qwen2ForSequenceClassification"),
    Family.QWEN3: ("Qwen3ForCausalLM", "Qwen3ForSequenceClassification"),
}
#: The MLP activations the Llama-layout families support (transformers' names of SiLU).
SUPPORTED_ACT = ("silu", "swish")


def fields_from_hf(d: Mapping[str, Any], family: Family) -> dict[str, Any]:
    """The ModelConfig fields of a Llama-layout transformers config dict (Llama, Mistral,
    Qwen2 / 3, and Qwen3-MoE / Mixtral's non-expert keys) that depend on the family: the
    sliding window (Mistral / Mixtral as given; Qwen only with ``use_sliding_window``), the
    q/k/v biases (Qwen2's default to on) and the q/k norm (Qwen3, Qwen3-MoE)."""
    sliding = d.get("sliding_window") if family in (Family.MISTRAL, Family.MIXTRAL) else None
    if family in (Family.QWEN2, Family.QWEN3, Family.QWEN3_MOE) and d.get("use_sliding_window"):
        sliding = d.get("sliding_window")
    return dict(
        attention_bias=bool(d.get("attention_bias", family == Family.QWEN2)),
        qk_norm=family in (Family.QWEN3, Family.QWEN3_MOE),
        sliding_window=sliding,
    )


def check_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """A Llama-layout config dict checked for what the shared layer does not implement, as
    the dict to read: a scalar sequence classifier as a tied model (transformers' classifier
    has no output projection, so our tree has no ``lm_head`` either), and a config whose
    ``layer_types`` are all full attention without its (unused) ``sliding_window``.

    Raises:
      ValueError: a non-SiLU MLP, an MLP bias, mixed per-layer attention types, or a sequence
        classifier with more than one label, naming the key.
    """
    d = dict(d)
    act = d.get("hidden_act", "silu")
    if act not in SUPPORTED_ACT:
        raise ValueError(f"hidden_act={act!r} is not supported; allowed: {list(SUPPORTED_ACT)}")
    if d.get("mlp_bias"):
        raise ValueError(
            "mlp_bias=true is not supported (Llama-family models without MLP bias only)"
        )
    layer_types = set(d.get("layer_types") or ())
    if len(layer_types) > 1:
        raise ValueError(
            f"per-layer attention types (layer_types="
            f"{sorted(layer_types)}) are not supported; all layers must match"
        )
    if layer_types == {"full_attention"}:
        d["sliding_window"] = None
    archs = d.get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in archs):
        num_labels = int(d.get("num_labels", len(d.get("id2label") or {}) or 1))
        if num_labels != 1:
            raise ValueError(
                f"a sequence classifier with num_labels={num_labels} "
                f"is not supported; only scalar heads (num_labels=1)"
            )
        d["num_labels"] = 1
        d["tie_word_embeddings"] = True
    return d


def layout_hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """The keywords of a Llama-layout transformers config class for ``config`` beyond the
    shared ones and the experts': the MLP width and activation, RoPE, and the family's q/k/v
    bias and sliding-window keys.

    Raises:
      ValueError: a Qwen2 config without q/k/v biases, or a Llama one with a q/k norm
        (transformers' classes cannot express them).
    """
    c = config
    rope: dict[str, Any] = {"rope_type": c.rope.scaling.value}
    if c.rope.scaling == RopeScaling.LINEAR:
        rope["factor"] = c.rope.factor
    elif c.rope.scaling == RopeScaling.LLAMA3:
        rope.update(
            factor=c.rope.factor,
            low_freq_factor=c.rope.low_freq_factor,
            high_freq_factor=c.rope.high_freq_factor,
            original_max_position_embeddings=c.rope.original_max_position,
        )
    kw: dict[str, Any] = dict(
        intermediate_size=c.mlp.intermediate_size,
        hidden_act="silu",
        rope_theta=c.rope.theta,
        rope_scaling=None if c.rope.scaling == RopeScaling.NONE else rope,
    )
    if c.family in (Family.LLAMA, Family.QWEN3, Family.QWEN3_MOE):
        kw["attention_bias"] = c.attn.bias
    elif c.family == Family.QWEN2 and not c.attn.bias:
        raise ValueError(
            "transformers' Qwen2 always has q/k/v biases; this config "
            "has attention_bias=False (use family 'llama' or 'qwen3')"
        )
    if c.family in (Family.MISTRAL, Family.MIXTRAL):
        kw["sliding_window"] = c.attn.sliding_window
    elif c.family in (Family.QWEN2, Family.QWEN3, Family.QWEN3_MOE):
        kw["use_sliding_window"] = c.attn.sliding_window is not None
        kw["sliding_window"] = c.attn.sliding_window
        kw["max_window_layers"] = 0 if c.attn.sliding_window is not None else c.num_layers
    if c.family == Family.LLAMA and c.attn.qk_norm:
        raise ValueError(
            "transformers' Llama has no q/k norm; this config has qk_norm=True (use family 'qwen3')"
        )
    return kw


def hf_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """The keywords of ``LlamaConfig`` / ``MistralConfig`` / ``Qwen2Config`` / ``Qwen3Config``
    for ``config`` beyond the shared ones (:func:`layout_hf_config_kwargs`).

    Raises:
      ValueError: a config with experts (those classes have none), or what
        :func:`layout_hf_config_kwargs` refuses.
    """
    if config.is_moe:
        raise ValueError(
            f"a {config.family.value} config with experts has no transformers class "
            f"(use family 'qwen3_moe' or 'mixtral')"
        )
    return layout_hf_config_kwargs(config)


#: Family -> :func:`fields_from_hf` of its config dicts (the registry's entries).
FIELDS_FROM_HF = {f: functools.partial(fields_from_hf, family=f) for f in HF_CONFIG_CLASSES}
