"""Gemma 3's vision weights both ways: transformers' ``Gemma3ForConditionalGeneration`` names
(``model.vision_tower.*``: SigLIP; ``model.multi_modal_projector.*``) and layouts
(``nn.Linear`` ``[out, in]``, the patch convolution ``[Dv, C, p, p]``, one entry per layer)
against ``params["vision"]`` (:func:`~jaxrl_llm.models.families.gemma.vision_config.vision_param_shapes`:
kernels ``[in, ...out]``, layers stacked). Pure numpy reshapes and transposes, so a round trip
is exact. Asked through the family's entry (:mod:`jaxrl_llm.models.families.registry`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxrl_llm.models.families.gemma.vision_config import GemmaVisionConfig

#: The prefixes of transformers 5's module tree (what :func:`hf_vision_names` gives).
TOWER = "model.vision_tower."
PROJECTOR = "model.multi_modal_projector."
#: Checkpoint spellings -> those: transformers' ``save_pretrained`` writes the original
#: checkpoints' top-level names (``vision_tower.*``; the hub's ``vision_tower.vision_model.*``).
_RENAMES = (
    ("model.vision_tower.vision_model.", TOWER),
    ("vision_tower.vision_model.", TOWER),
    ("vision_tower.", TOWER),
    ("multi_modal_projector.", PROJECTOR),
)
#: Prefixes of every vision tensor after :func:`hf_vision_names`.
VISION_PREFIXES = (TOWER, PROJECTOR)

# (our stacked module, leaf) -> transformers name inside ``encoder.layers.{i}.``
_LAYER_NAMES = {
    ("layers_ln1", "scale"): "layer_norm1.weight",
    ("layers_ln1", "bias"): "layer_norm1.bias",
    ("layers_q", "kernel"): "self_attn.q_proj.weight",
    ("layers_q", "bias"): "self_attn.q_proj.bias",
    ("layers_k", "kernel"): "self_attn.k_proj.weight",
    ("layers_k", "bias"): "self_attn.k_proj.bias",
    ("layers_v", "kernel"): "self_attn.v_proj.weight",
    ("layers_v", "bias"): "self_attn.v_proj.bias",
    ("layers_o", "kernel"): "self_attn.out_proj.weight",
    ("layers_o", "bias"): "self_attn.out_proj.bias",
    ("layers_ln2", "scale"): "layer_norm2.weight",
    ("layers_ln2", "bias"): "layer_norm2.bias",
    ("layers_fc1", "kernel"): "mlp.fc1.weight",
    ("layers_fc1", "bias"): "mlp.fc1.bias",
    ("layers_fc2", "kernel"): "mlp.fc2.weight",
    ("layers_fc2", "bias"): "mlp.fc2.bias",
}
# (our module, leaf) -> full transformers name after the tower / projector prefix
_TOP_NAMES = {
    ("patch_embed", "kernel"): TOWER + "embeddings.patch_embedding.weight",
    ("patch_embed", "bias"): TOWER + "embeddings.patch_embedding.bias",
    ("pos_embed", "embedding"): TOWER + "embeddings.position_embedding.weight",
    ("post_ln", "scale"): TOWER + "post_layernorm.weight",
    ("post_ln", "bias"): TOWER + "post_layernorm.bias",
    ("proj_norm", "scale"): PROJECTOR + "mm_soft_emb_norm.weight",
    ("proj", "kernel"): PROJECTOR + "mm_input_projection_weight",
}


def _hf_layer_shape(v: GemmaVisionConfig, module: str, leaf: str) -> tuple[int, ...]:
    """One layer's tensor shape in transformers' layout."""
    d, f = v.hidden_size, v.intermediate_size
    if leaf in ("scale",) or (leaf == "bias" and module in ("layers_ln1", "layers_ln2")):
        return (d,)
    if module == "layers_fc1":
        return (f, d) if leaf == "kernel" else (f,)
    if module == "layers_fc2":
        return (d, f) if leaf == "kernel" else (d,)
    return (d, d) if leaf == "kernel" else (d,)


def _to_ours(w: np.ndarray, module: str, leaf: str, v: GemmaVisionConfig) -> np.ndarray:
    """One layer's transformers tensor -> ours (no layer axis)."""
    h, e, d = v.num_heads, v.head_dim, v.hidden_size
    if module in ("layers_q", "layers_k", "layers_v"):
        return w.T.reshape(d, h, e) if leaf == "kernel" else w.reshape(h, e)
    if module == "layers_o" and leaf == "kernel":
        return w.T.reshape(h, e, d)
    return w.T if leaf == "kernel" else w


def _to_hf(w: np.ndarray, module: str, leaf: str, v: GemmaVisionConfig) -> np.ndarray:
    """Inverse of :func:`_to_ours` for one layer."""
    d = v.hidden_size
    if module in ("layers_q", "layers_k", "layers_v"):
        return w.reshape(d, d).T if leaf == "kernel" else w.reshape(d)
    if module == "layers_o" and leaf == "kernel":
        return w.reshape(d, d).T
    return w.T if leaf == "kernel" else w


def _renamed(k: str) -> str:
    """One checkpoint name under transformers 5's module tree."""
    for old, new in _RENAMES:
        if k.startswith(old):
            return new + k[len(old) :]
    return k


def hf_vision_names(sd: Mapping[str, Any]) -> dict[str, Any]:
    """``sd`` with the vision tensors of every checkpoint spelling (``vision_tower.*``,
    ``vision_tower.vision_model.*``, ``multi_modal_projector.*``, with or without ``model.``)
    under transformers 5's ``model.vision_tower.*`` / ``model.multi_modal_projector.*``."""
    return {_renamed(k): w for k, w in sd.items()}


def vision_weights_from_hf(
    take: Callable[[str, tuple[int, ...]], np.ndarray], v: GemmaVisionConfig
) -> dict[str, dict[str, np.ndarray]]:
    """``params["vision"]`` read through ``take(name, hf_shape)`` (the importer's checked
    lookup, over :func:`hf_vision_names`)."""
    p, c, d = v.patch_size, v.num_channels, v.hidden_size
    top_shapes = {
        ("patch_embed", "kernel"): (d, c, p, p),
        ("patch_embed", "bias"): (d,),
        ("pos_embed", "embedding"): (v.num_patches, d),
        ("post_ln", "scale"): (d,),
        ("post_ln", "bias"): (d,),
        ("proj_norm", "scale"): (d,),
        ("proj", "kernel"): (d, v.text_hidden_size),
    }
    out: dict[str, dict[str, np.ndarray]] = {}
    for (m, leaf), name in _TOP_NAMES.items():
        out.setdefault(m, {})[leaf] = take(name, top_shapes[(m, leaf)])
    out["patch_embed"]["kernel"] = out["patch_embed"]["kernel"].transpose(2, 3, 1, 0)
    for (m, leaf), name in _LAYER_NAMES.items():
        shape = _hf_layer_shape(v, m, leaf)
        per = [
            _to_ours(take(f"{TOWER}encoder.layers.{i}.{name}", shape), m, leaf, v)
            for i in range(v.num_layers)
        ]
        out.setdefault(m, {})[leaf] = np.stack(per, axis=0)
    return out


def vision_weights_to_hf(
    params: Mapping[str, Mapping[str, Any]], v: GemmaVisionConfig
) -> dict[str, np.ndarray]:
    """The transformers name -> array map of ``params["vision"]`` (the inverse of
    :func:`vision_weights_from_hf`)."""
    out: dict[str, np.ndarray] = {}
    for (m, leaf), name in _TOP_NAMES.items():
        out[name] = np.asarray(params[m][leaf])
    kernel = _TOP_NAMES[("patch_embed", "kernel")]
    out[kernel] = out[kernel].transpose(3, 2, 0, 1)
    for (m, leaf), name in _LAYER_NAMES.items():
        stacked = np.asarray(params[m][leaf])
        for i in range(v.num_layers):
            out[f"{TOWER}encoder.layers.{i}.{name}"] = _to_hf(stacked[i], m, leaf, v)
    return out
