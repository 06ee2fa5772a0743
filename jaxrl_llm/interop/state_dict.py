"""Name and layout mapping between transformers' Llama-family state dicts and our params tree.

transformers stores every projection as an ``nn.Linear`` weight ``[out, in]`` with one entry
per layer (``model.layers.{i}.self_attn.q_proj.weight``); we store kernels ``[in, ...out]``
stacked along a leading layer axis (``params["layers"]["q_proj"]["kernel"]`` is
``[L, D, H, E]``, see :func:`jaxrl_llm.models.param_shapes_and_axes`). Both directions are
pure numpy reshapes/transposes, so a round trip is exact.

Gemma 2 / 3 add a norm after attention and after the MLP; transformers calls the pre-MLP norm
``pre_feedforward_layernorm`` there and uses ``post_attention_layernorm`` for the norm *after*
attention (in Llama it is the pre-MLP norm), so the names depend on ``config.norms.post_norms``.
Gemma norm weights are stored as transformers stores them (w of the (1 + w) form).

These are the Llama layout's names (:mod:`jaxrl_llm.models.families.llama`: Llama, Mistral,
Qwen2 / 3 have no tensors of their own). A mixture of experts' router and experts are mapped in
:mod:`~jaxrl_llm.interop.state_dict_moe`, under the names the family's entry gives; padded heads, per-layer inputs and the k/v tensors of
KV-shared layers (the features Gemma 4 brought) in :mod:`~jaxrl_llm.interop.state_dict_gemma4`.
A family with tensors of its own (:mod:`jaxrl_llm.models.families`: gpt-oss, Qwen3.5,
Gemma 4) maps them through its entry
(:attr:`~jaxrl_llm.models.families.registry.FamilyEntry.layer_weights`).

RoPE layout: transformers' Llama/Mistral/Qwen/Gemma checkpoints use the "rotate half" layout, which is
what :func:`jaxrl_llm.models.positions.apply_rope` implements, so q/k weights need no
permutation (transformers' GGUF reader already undoes llama.cpp's interleaved permutation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.interop.state_dict_gemma4 import (
    PER_LAYER_INPUT_NAMES,
    PER_LAYER_TOP,
    absent_in_hf,
    pad_layer,
    per_layer_inputs_from_hf,
    per_layer_inputs_to_hf,
    unpad_layer,
)
from jaxrl_llm.interop.state_dict_moe import MOE_MODULES, experts_from_hf, experts_to_hf
from jaxrl_llm.interop.weight_checks import float_weight, to_numpy
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.families.registry import FamilyEntry, entry_of
from jaxrl_llm.models.layer_scan import module_layers
from jaxrl_llm.models.params import param_shapes_and_axes

# Keys transformers may put in a state dict that carry no parameter of ours.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.original_inv_freq")

# (our layer sub-tree, leaf) -> transformers name inside ``model.layers.{i}.``
_LAYER_NAMES: dict[tuple[str, str], str] = {
    ("attn_norm", "scale"): "input_layernorm.weight",
    ("q_proj", "kernel"): "self_attn.q_proj.weight",
    ("k_proj", "kernel"): "self_attn.k_proj.weight",
    ("v_proj", "kernel"): "self_attn.v_proj.weight",
    ("o_proj", "kernel"): "self_attn.o_proj.weight",
    ("q_proj", "bias"): "self_attn.q_proj.bias",
    ("k_proj", "bias"): "self_attn.k_proj.bias",
    ("v_proj", "bias"): "self_attn.v_proj.bias",
    ("q_norm", "scale"): "self_attn.q_norm.weight",
    ("k_norm", "scale"): "self_attn.k_norm.weight",
    ("mlp_norm", "scale"): "post_attention_layernorm.weight",
    ("gate_proj", "kernel"): "mlp.gate_proj.weight",
    ("up_proj", "kernel"): "mlp.up_proj.weight",
    ("down_proj", "kernel"): "mlp.down_proj.weight",
}

# Gemma 2 / 3 (config.norms.post_norms): the four norms around attention and the MLP.
_POST_NORM_NAMES: dict[tuple[str, str], str] = {
    ("mlp_norm", "scale"): "pre_feedforward_layernorm.weight",
    ("post_attn_norm", "scale"): "post_attention_layernorm.weight",
    ("post_mlp_norm", "scale"): "post_feedforward_layernorm.weight",
}

# Gemma3ForConditionalGeneration nests the text decoder; its other parts are not ours.
_MULTIMODAL_TEXT_PREFIX = "model.language_model."
_MULTIMODAL_OTHER = (
    "model.vision_tower.",
    "model.multi_modal_projector.",
    "model.visual.",
    "model.audio_tower.",
    "model.embed_vision.",
    "model.embed_audio.",
)
# The original checkpoints' spellings (what transformers' save_pretrained writes for Gemma 3):
# ``language_model.model.*`` / ``language_model.lm_head.*`` beside the top-level towers.
_LEGACY_TEXT = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."))
_LEGACY_OTHER = ("vision_tower.", "multi_modal_projector.")
# Qwen3.5 checkpoints carry a multi-token-prediction head that transformers does not load.
_IGNORED_PREFIXES = ("mtp.",)


def hf_projection_name(module: str, layer: int) -> str:
    """Transformers' module name of one layer's projection, e.g.
    ``hf_projection_name("q_proj", 3) == "model.layers.3.self_attn.q_proj"`` (the prefix of
    its ``.weight``; PEFT names its adapters after it).

    Raises:
      ModelLoadError: ``module`` is not one of the seven dense projections.
    """
    name = _LAYER_NAMES.get((module, "kernel"))
    if name is None or not module.endswith("_proj"):
        allowed = sorted(m for m, leaf in _LAYER_NAMES if leaf == "kernel")
        raise ModelLoadError(f"{module!r} is not a dense projection; allowed: {allowed}")
    return f"model.layers.{layer}.{name.removesuffix('.weight')}"


def _layer_names(config: ModelConfig) -> dict[tuple[str, str], str]:
    """(our layer sub-tree, leaf) -> transformers name inside ``model.layers.{i}.``."""
    names = {**_LAYER_NAMES, **_POST_NORM_NAMES} if config.norms.post_norms else dict(_LAYER_NAMES)
    if config.norms.layer_scalars:
        names[("layer_scalar", "value")] = "layer_scalar"
    if config.tokens.per_layer_input_size:
        names.update(PER_LAYER_INPUT_NAMES)
    return names


def _hf_layer_shape(config: ModelConfig, module: str, leaf: str, layer: int) -> tuple[int, ...]:
    """Shape of layer ``layer``'s tensor in transformers' layout."""
    c = config
    (k, e), d, f, h = c.layer_heads(layer), c.hidden_size, c.mlp_width(layer), c.attn.num_heads
    return {
        ("attn_norm", "scale"): (d,),
        ("mlp_norm", "scale"): (d,),
        ("post_attn_norm", "scale"): (d,),
        ("post_mlp_norm", "scale"): (d,),
        ("q_proj", "kernel"): (h * e, d),
        ("k_proj", "kernel"): (k * e, d),
        ("v_proj", "kernel"): (k * e, d),
        ("o_proj", "kernel"): (d, h * e),
        ("q_proj", "bias"): (h * e,),
        ("k_proj", "bias"): (k * e,),
        ("v_proj", "bias"): (k * e,),
        ("q_norm", "scale"): (e,),
        ("k_norm", "scale"): (e,),
        ("gate_proj", "kernel"): (f, d),
        ("up_proj", "kernel"): (f, d),
        ("down_proj", "kernel"): (d, f),
        ("layer_scalar", "value"): (1,),
        ("per_layer_gate", "kernel"): (c.tokens.per_layer_input_size, d),
        ("per_layer_proj", "kernel"): (d, c.tokens.per_layer_input_size),
        ("per_layer_post_norm", "scale"): (d,),
    }[(module, leaf)]


def _layer_to_ours(
    w: np.ndarray, module: str, leaf: str, config: ModelConfig, layer: int
) -> np.ndarray:
    """Layer ``layer``'s transformers tensor -> our per-layer layout (no layer axis), heads
    padded to the stored size (:func:`pad_layer`)."""
    return pad_layer(_unstack_to_ours(w, module, leaf, config, layer), module, leaf, config)


def _unstack_to_ours(
    w: np.ndarray, module: str, leaf: str, config: ModelConfig, layer: int
) -> np.ndarray:
    """Layer ``layer``'s transformers tensor -> ours at the layer's own head size."""
    c = config
    e = c.layer_heads(layer)[1]
    if leaf == "scale":
        return w
    if leaf == "value":  # layer_scalar [1] -> []
        return w.reshape(())
    if leaf == "bias":  # [N*E] -> [N, E]
        return w.reshape(-1, e)
    if module in ("q_proj", "k_proj", "v_proj"):  # [N*E, D] -> [D, N, E]
        return w.T.reshape(c.hidden_size, -1, e)
    if module == "o_proj":  # [D, H*E] -> [H, E, D]
        return w.T.reshape(c.attn.num_heads, e, c.hidden_size)
    return w.T  # gate/up [F, D] -> [D, F]; down [D, F] -> [F, D]


def _layer_to_hf(w: np.ndarray, module: str, leaf: str, config: ModelConfig) -> np.ndarray:
    """Inverse of :func:`_layer_to_ours` for one layer."""
    c = config
    if leaf == "scale":
        return w
    if leaf == "value":  # layer_scalar [] -> [1]
        return w.reshape(1)
    if leaf == "bias":
        return w.reshape(-1)
    if module in ("q_proj", "k_proj", "v_proj"):  # [D, N, E] -> [N*E, D]
        return w.reshape(c.hidden_size, -1).T
    if module == "o_proj":  # [H, E, D] -> [D, H*E]
        return w.reshape(-1, c.hidden_size).T
    return w.T


def _own_weights(config: ModelConfig) -> tuple[FamilyEntry, frozenset[tuple[str, str]]]:
    """The entry of ``config``'s family and the ``(module, leaf)`` pairs of
    ``params["layers"]`` it maps itself (none for the Llama layout's families)."""
    entry = entry_of(config.family)
    return entry, entry.layer_weights


def _maps_experts(own: frozenset[tuple[str, str]]) -> bool:
    """Whether a family maps the router and experts itself (gpt-oss), not
    :mod:`~jaxrl_llm.interop.state_dict_moe`."""
    return ("router", "kernel") in own


def params_from_hf_state_dict(
    state_dict: Mapping[str, Any], config: ModelConfig, *, source: str = "state dict"
) -> dict[str, Any]:
    """Convert a transformers Llama/Mistral/Qwen2/Qwen3/Gemma/Qwen3-MoE/Mixtral state dict into
    our params tree.

    Handles ``*ForCausalLM`` (``lm_head.weight``, ignored when ``config.tie_embeddings``)
    and ``*ForSequenceClassification`` (``score.weight`` -> ``params["score_head"]``)
    layouts; names may lack the ``model.`` prefix (bare ``LlamaModel`` state dicts).

    Args:
      state_dict: name -> tensor (numpy, torch or jax), transformers' names and layouts,
        e.g. ``model.layers.{i}.self_attn.q_proj.weight`` ``[H·E, D]``.
      config: the :class:`~jaxrl_llm.models.ModelConfig` the tree must match.
      source: how to name the input in error messages (a path).

    Returns:
      A params tree with exactly the structure and shapes of
      :func:`jaxrl_llm.models.param_shapes_and_axes` (numpy arrays; dtype as stored, bf16
      stays ml_dtypes bfloat16, torch bf16 becomes float32).

    Raises:
      ModelLoadError: a missing key, a shape mismatch, a weight that is not floating point,
        or a key we do not know how to map (e.g. an MLP bias), each naming the key and the
        source.
    """
    sd = _text_model_names(dict(state_dict))
    used: set[str] = set()
    take = checked_taker(sd, used, config, source)
    specs = param_shapes_and_axes(config)
    layers = _layers_from_hf(take, sd, config, specs)
    v, d = config.vocab_size, config.hidden_size
    params: dict[str, Any] = {
        "embed": {"embedding": take("model.embed_tokens.weight", (v, d))},
        "layers": layers,
        "final_norm": {"scale": take("model.norm.weight", (d,))},
    }
    if config.tokens.per_layer_input_size:
        params.update(per_layer_inputs_from_hf(take, config))
    if "lm_head" in specs:
        params["lm_head"] = {"kernel": take("lm_head.weight", (v, d)).T}
    elif "lm_head.weight" in sd:
        used.add("lm_head.weight")  # tied: transformers lists the shared tensor twice
    if "score_head" in specs:
        params["score_head"] = {"kernel": take("score.weight", (config.num_labels, d)).T}

    extra = sorted(
        k
        for k in sd
        if k not in used
        and not k.endswith(_IGNORED_SUFFIXES)
        and not k.startswith(_IGNORED_PREFIXES)
    )
    if extra:
        more = f" (and {len(extra) - 3} more)" if len(extra) > 3 else ""
        raise ModelLoadError(
            f"{source}: unexpected weights {extra[:3]}{more}; this "
            f"{config.family.value} config does not use them (unsupported "
            f"feature such as MLP bias, or a config/weights mismatch)"
        )
    return params


def _text_model_names(sd: dict[str, Any]) -> dict[str, Any]:
    """A state dict under the names of a text-only ``*ForCausalLM``: a multimodal
    checkpoint's text tower renamed (its other towers dropped), and ``model.`` put in front
    of a bare model's names."""
    if any(k.startswith(_LEGACY_TEXT[0][0]) for k in sd):
        sd = {_legacy_name(k): v for k, v in sd.items() if not k.startswith(_LEGACY_OTHER)}
    if any(k.startswith(_MULTIMODAL_TEXT_PREFIX) for k in sd):
        sd = {
            "model." + k[len(_MULTIMODAL_TEXT_PREFIX) :] if k.startswith("model.") else k: v
            for k, v in sd.items()
            if not k.startswith(_MULTIMODAL_OTHER)
        }
    if sd and not any(k.startswith("model.") for k in sd):
        sd = {
            ("model." + k if not k.startswith(("lm_head.", "score.")) else k): v
            for k, v in sd.items()
        }
    return sd


def _legacy_name(k: str) -> str:
    """A legacy multimodal checkpoint's text name under a ``*ForCausalLM``'s."""
    for old, new in _LEGACY_TEXT:
        if k.startswith(old):
            return new + k[len(old) :]
    return k


def checked_taker(sd: Mapping[str, Any], used: set[str], config: ModelConfig, source: str):
    """``take(name, shape, *, packed=False)``: the tensor ``name`` of ``sd``, checked (present,
    of ``shape``, floating point; ``packed``: uint8, a quantised format its family unpacks),
    and recorded in ``used``."""

    def take(name: str, shape: tuple[int, ...], *, packed: bool = False) -> np.ndarray:
        if name not in sd:
            raise ModelLoadError(
                f"{source}: missing weight {name!r} (expected shape {shape}) "
                f"for a {config.family.value} model with "
                f"{config.num_layers} layers"
            )
        w = to_numpy(sd[name]) if packed else float_weight(name, sd[name], source=source)
        if packed and w.dtype != np.uint8:
            raise ModelLoadError(f"{source}: weight {name!r} has dtype {w.dtype}, expected uint8")
        if tuple(w.shape) != tuple(shape):
            raise ModelLoadError(
                f"{source}: weight {name!r} has shape {tuple(w.shape)}, "
                f"expected {tuple(shape)} from the model config"
            )
        used.add(name)
        return w

    return take


def _layers_from_hf(take, sd: Mapping[str, Any], config: ModelConfig, specs) -> dict[str, Any]:
    """``params["layers"]``: the family's own tensors (its entry's weights), the MoE
    experts unless the family maps them, then every other leaf of ``specs["layers"]`` stacked
    over its layers (zeros where transformers has none, :func:`absent_in_hf`)."""
    names = _layer_names(config)
    layers: dict[str, dict[str, np.ndarray]] = {}
    entry, own = _own_weights(config)
    if entry.weights_from_hf is not None:
        layers.update(entry.weights_from_hf(take, sd, config))
    if config.is_moe and not _maps_experts(own):
        layers.update(experts_from_hf(take, sd, config))
    for module, leaves in specs["layers"].items():
        if module in MOE_MODULES and not _maps_experts(own):
            continue
        layers.setdefault(module, {})
        for leaf, (shape, _) in leaves.items():
            if (module, leaf) in own:
                continue
            hf_name = names[(module, leaf)]
            per_layer: list[np.ndarray | None] = []
            for i in module_layers(config, module):
                if absent_in_hf(config, module, i):
                    per_layer.append(None)  # zeros, in the dtype of the layers that have it
                    continue
                w = take(f"model.layers.{i}.{hf_name}", _hf_layer_shape(config, module, leaf, i))
                per_layer.append(_layer_to_ours(w, module, leaf, config, i))
            some = next((w for w in per_layer if w is not None), np.zeros(shape[1:], np.float32))
            layers[module][leaf] = np.stack(
                [np.zeros_like(some) if w is None else w for w in per_layer], axis=0
            )
    return layers


def params_to_hf_state_dict(
    params: Mapping[str, Any], config: ModelConfig
) -> dict[str, np.ndarray]:
    """Convert our params tree into a transformers state dict (numpy arrays).

    The inverse of :func:`params_from_hf_state_dict`. A model with a scalar head
    (``config.num_labels == 1``) maps to the ``*ForSequenceClassification`` layout
    (``score.weight``; no ``lm_head``); otherwise to ``*ForCausalLM`` (``lm_head.weight``
    only when the embeddings are untied).

    Args:
      params: tree with the structure of :func:`jaxrl_llm.models.param_shapes_and_axes`.
      config: the model config.

    Returns:
      name -> contiguous numpy array in the params' dtype (bf16 as ml_dtypes bfloat16).

    Raises:
      ModelLoadError: a parameter is missing or has the wrong shape for ``config``.
    """
    specs = param_shapes_and_axes(config)

    def get(tree: Mapping[str, Any], path: tuple[str, ...], shape) -> np.ndarray:
        node: Any = tree
        for p in path:
            if not isinstance(node, Mapping) or p not in node:
                raise ModelLoadError(
                    f"params: missing {'/'.join(path)} (expected shape {tuple(shape)})"
                )
            node = node[p]
        w = np.asarray(node)
        if tuple(w.shape) != tuple(shape):
            raise ModelLoadError(
                f"params: {'/'.join(path)} has shape {tuple(w.shape)}, "
                f"expected {tuple(shape)} from the model config"
            )
        return w

    out: dict[str, np.ndarray] = {}
    out["model.embed_tokens.weight"] = get(
        params, ("embed", "embedding"), specs["embed"]["embedding"][0]
    )
    names = _layer_names(config)
    entry, own = _own_weights(config)
    if entry.weights_to_hf is not None:
        mine: dict[str, dict[str, np.ndarray]] = {}
        for m, leaf in sorted(own):
            if leaf in specs["layers"].get(m, {}):
                shape = specs["layers"][m][leaf][0]
                mine.setdefault(m, {})[leaf] = get(params, ("layers", m, leaf), shape)
        out.update(entry.weights_to_hf(mine, config))
    if config.is_moe and not _maps_experts(own):
        moe = {
            m: get(params, ("layers", m, "kernel"), specs["layers"][m]["kernel"][0])
            for m in MOE_MODULES
        }
        out.update(experts_to_hf(moe, config))
    for module, leaves in specs["layers"].items():
        if module in MOE_MODULES and not _maps_experts(own):
            continue
        for leaf, (shape, _) in leaves.items():
            if (module, leaf) in own:
                continue
            stacked = get(params, ("layers", module, leaf), shape)
            hf_name = names[(module, leaf)]
            for j, i in enumerate(module_layers(config, module)):
                if absent_in_hf(config, module, i):
                    continue
                w = unpad_layer(stacked[j], module, leaf, config, i)
                out[f"model.layers.{i}.{hf_name}"] = _layer_to_hf(w, module, leaf, config)
    out["model.norm.weight"] = get(params, ("final_norm", "scale"), specs["final_norm"]["scale"][0])
    if config.tokens.per_layer_input_size:
        ple = {k: get(params, (k, leaf), specs[k][leaf][0]) for k, leaf in PER_LAYER_TOP}
        out.update(per_layer_inputs_to_hf(ple, config))
    if config.num_labels:
        out["score.weight"] = get(
            params, ("score_head", "kernel"), specs["score_head"]["kernel"][0]
        ).T
    elif "lm_head" in specs:
        out["lm_head.weight"] = get(params, ("lm_head", "kernel"), specs["lm_head"]["kernel"][0]).T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
