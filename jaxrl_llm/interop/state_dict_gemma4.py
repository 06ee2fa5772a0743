"""What the shared mapping (:mod:`jaxrl_llm.interop.state_dict`) does for the config features
Gemma 4 brought, asked by feature and not by family: the names of the per-layer inputs
(``per_layer_input_size``) and their tensors beside the layers, the padding of heads
(``has_padded_heads``) and of the double-wide MLP (``double_wide_mlp``), and the tensors a
layer does not have in transformers (KV sharing, ``global_k_eq_v``). Gemma 4's own tensors
(its fused experts and the MoE block's router scales and norms) are its folder's
(:mod:`jaxrl_llm.models.families.gemma4.weights`).

Gemma 4: the same names as Gemma 3 (and ``layer_scalar`` ``[1]`` per layer, ours a scalar of
``layer_scalar/value``). Its full-attention layers' q/k/v/o and q/k norms have their own head
dim and KV heads; ours are stored padded to the larger layer's
(:mod:`jaxrl_llm.models.padded_heads`): import pads, export strips the padding. A full-attention
layer with ``attention_k_eq_v`` has no ``v_proj`` (ours stays zero).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl_llm.models.config import LayerType, ModelConfig
from jaxrl_llm.models.padded_heads import pad_heads, unpad_heads
from jaxrl_llm.models.params import head_axes

# Gemma 4's per-layer inputs (config.tokens.per_layer_input_size): each layer's gate, projection, norm.
PER_LAYER_INPUT_NAMES: dict[tuple[str, str], str] = {
    ("per_layer_gate", "kernel"): "per_layer_input_gate.weight",
    ("per_layer_proj", "kernel"): "per_layer_projection.weight",
    ("per_layer_post_norm", "scale"): "post_per_layer_input_norm.weight",
}

# Gemma 4's per-layer-input tensors beside the layers: (our sub-tree, leaf).
PER_LAYER_TOP = (
    ("embed_per_layer", "embedding"),
    ("per_layer_projection", "kernel"),
    ("per_layer_norm", "scale"),
)


def per_layer_inputs_from_hf(take, config: ModelConfig) -> dict[str, Any]:
    """Gemma 4's per-layer-input embedding ``[V_ple, L·P]``, projection ``[L·P, D]`` and norm
    ``[P]`` as ours (``[V_ple, L, P]``, ``[D, L, P]``, ``[P]``)."""
    c = config
    n, p, d = c.num_layers, c.tokens.per_layer_input_size, c.hidden_size
    emb = take("model.embed_tokens_per_layer.weight", (c.per_layer_vocab, n * p))
    proj = take("model.per_layer_model_projection.weight", (n * p, d))
    return {
        "embed_per_layer": {"embedding": emb.reshape(-1, n, p)},
        "per_layer_projection": {"kernel": proj.T.reshape(d, n, p)},
        "per_layer_norm": {"scale": take("model.per_layer_projection_norm.weight", (p,))},
    }


def per_layer_inputs_to_hf(ple: Mapping[str, np.ndarray], config: ModelConfig):
    """Inverse of :func:`per_layer_inputs_from_hf`."""
    d = config.hidden_size
    return {
        "model.embed_tokens_per_layer.weight": ple["embed_per_layer"].reshape(
            config.per_layer_vocab, -1
        ),
        "model.per_layer_model_projection.weight": ple["per_layer_projection"].reshape(d, -1).T,
        "model.per_layer_projection_norm.weight": ple["per_layer_norm"],
    }


def absent_in_hf(config: ModelConfig, module: str, layer: int) -> bool:
    """True when transformers has no such tensor in this layer (ours stays zero): a Gemma 4
    full-attention layer's ``v_proj`` with ``attention_k_eq_v`` (its values are its keys); a
    KV-shared layer's ``k_proj``, ``v_proj`` and ``k_norm`` (``num_kv_shared_layers``)."""
    if module in ("k_proj", "v_proj", "k_norm") and config.kv_shared(layer):
        return True
    return (
        module == "v_proj"
        and config.attn.global_k_eq_v
        and config.attn.layer_types[layer] == LayerType.GLOBAL
    )


#: The axis of each dense MLP kernel (ours, one layer) that holds its F units.
_MLP_UNITS_AXIS = {"gate_proj": 1, "up_proj": 1, "down_proj": 0}


def pad_layer(w: np.ndarray, module: str, leaf: str, config: ModelConfig) -> np.ndarray:
    """One layer's tensor (ours, at the layer's own size) padded with zeros to the stored
    size: attention heads to the stored heads (:mod:`jaxrl_llm.models.padded_heads`), MLP units to
    ``intermediate_size`` (``double_wide_mlp``); other tensors unchanged."""
    units = _MLP_UNITS_AXIS.get(module)
    if units is not None and config.mlp.double_wide:
        pad = [(0, 0)] * w.ndim
        pad[units] = (0, config.mlp.intermediate_size - w.shape[units])
        return np.pad(w, pad)
    axes = head_axes(module, leaf)
    if not config.has_padded_heads or axes is None:
        return w
    return pad_heads(w, *axes, config.store_kv_heads, config.store_head_dim)


def unpad_layer(w: np.ndarray, module: str, leaf: str, config: ModelConfig, layer: int):
    """Inverse of :func:`pad_layer` for layer ``layer``."""
    units = _MLP_UNITS_AXIS.get(module)
    if units is not None and config.mlp.double_wide:
        return np.take(w, np.arange(config.mlp_width(layer)), axis=units)
    axes = head_axes(module, leaf)
    if not config.has_padded_heads or axes is None:
        return w
    k, e = config.layer_heads(layer)
    return unpad_heads(w, *axes, k, e)
