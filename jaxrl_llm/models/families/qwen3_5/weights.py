"""Qwen3.5's weight names and layouts between transformers' state dicts and our params tree,
both ways (:func:`weights_from_hf`, :func:`weights_to_hf`), for the tensors that are Qwen3.5's
own: the Gated DeltaNet (LINEAR) layers, the attention output gate inside transformers'
``q_proj`` and Qwen3.5-MoE's shared expert. The norms, k/v/o projections and the routed experts
it shares with Llama and Qwen3-MoE are mapped by :mod:`jaxrl_llm.interop.state_dict`, which
asks this module through :mod:`jaxrl_llm.models.families.registry`.

transformers' ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``, inside ``model.layers.{i}.``:
a LINEAR layer's ``linear_attn.*`` tensors go to the sub-trees stacked over the LINEAR layers
only, the attention layers' ``self_attn.*`` to those stacked over the attention layers
(:func:`jaxrl_llm.models.layer_scan.module_layers`); ``self_attn.q_proj`` holds, per head, the
E query rows then the E output-gate rows (ours: ``q_proj`` and ``attn_gate``); the conv
``[C, 1, W]`` is ours ``[W, C]``; ``in_proj_z`` ``[H_v·d_v, D]`` is ours ``[D, H_v, d_v]`` and
``out_proj`` ``[D, H_v·d_v]`` ours ``[H_v, d_v, D]``; every other kernel is the ``nn.Linear``
transpose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.layer_scan import module_layers
from jaxrl_llm.models.params import param_shapes_and_axes

#: (our layer sub-tree, leaf) -> transformers' name inside ``model.layers.{i}.``, for the
#: tensors this module maps (those a config has: :func:`own_weights`).
NAMES: dict[tuple[str, str], str] = {
    ("in_proj_qkv", "kernel"): "linear_attn.in_proj_qkv.weight",
    ("in_proj_z", "kernel"): "linear_attn.in_proj_z.weight",
    ("in_proj_b", "kernel"): "linear_attn.in_proj_b.weight",
    ("in_proj_a", "kernel"): "linear_attn.in_proj_a.weight",
    ("conv", "kernel"): "linear_attn.conv1d.weight",
    ("delta", "a_log"): "linear_attn.A_log",
    ("delta", "dt_bias"): "linear_attn.dt_bias",
    ("linear_norm", "scale"): "linear_attn.norm.weight",
    ("out_proj", "kernel"): "linear_attn.out_proj.weight",
    ("q_proj", "kernel"): "self_attn.q_proj.weight",
    ("attn_gate", "kernel"): "self_attn.q_proj.weight",
    ("shared_gate_proj", "kernel"): "mlp.shared_expert.gate_proj.weight",
    ("shared_up_proj", "kernel"): "mlp.shared_expert.up_proj.weight",
    ("shared_down_proj", "kernel"): "mlp.shared_expert.down_proj.weight",
    ("shared_expert_gate", "kernel"): "mlp.shared_expert_gate.weight",
}
#: Qwen3.5-MoE's per-expert checkpoint names (block prefix, gate, up, down), as Qwen3-MoE's:
#: ``mlp.experts.{j}.gate_proj`` ...; the shared expert mapping reads them
#: (:mod:`jaxrl_llm.interop.state_dict_moe`).
EXPERT_NAMES = ("mlp", "gate_proj", "up_proj", "down_proj")
#: The (module, leaf) pairs of ``params["layers"]`` this module maps; the rest are the shared
#: mapping's.
LAYER_WEIGHTS = frozenset(NAMES)

Take = Callable[..., np.ndarray]


def own_weights(config: ModelConfig) -> list[tuple[str, str]]:
    """The pairs of :data:`LAYER_WEIGHTS` that ``config``'s params tree has (a dense Qwen3.5
    has no shared expert), in :data:`NAMES`' order."""
    layers = param_shapes_and_axes(config)["layers"]
    return [(m, leaf) for m, leaf in NAMES if leaf in layers.get(m, {})]


def _hf_shape(config: ModelConfig, module: str, leaf: str, layer: int) -> tuple[int, ...]:
    """Shape of layer ``layer``'s tensor in transformers' layout."""
    c = config
    e, d, h = c.layer_heads(layer)[1], c.hidden_size, c.attn.num_heads
    hv, dv, ch = c.linear.num_value_heads, c.linear.value_head_dim, c.linear_conv_channels
    s = c.moe.shared_expert_size
    return {
        ("in_proj_qkv", "kernel"): (ch, d),
        ("in_proj_z", "kernel"): (hv * dv, d),
        ("in_proj_b", "kernel"): (hv, d),
        ("in_proj_a", "kernel"): (hv, d),
        ("conv", "kernel"): (ch, 1, c.linear.conv_kernel),
        ("delta", "a_log"): (hv,),
        ("delta", "dt_bias"): (hv,),
        ("linear_norm", "scale"): (dv,),
        ("out_proj", "kernel"): (d, hv * dv),
        ("q_proj", "kernel"): (2 * h * e, d),
        ("attn_gate", "kernel"): (2 * h * e, d),
        ("shared_gate_proj", "kernel"): (s, d),
        ("shared_up_proj", "kernel"): (s, d),
        ("shared_down_proj", "kernel"): (d, s),
        ("shared_expert_gate", "kernel"): (1, d),
    }[(module, leaf)]


def _to_ours(w: np.ndarray, module: str, leaf: str, config: ModelConfig) -> np.ndarray:
    """One layer's transformers tensor -> ours (no layer axis)."""
    c = config
    if leaf in ("scale", "a_log", "dt_bias"):
        return w
    if module in ("q_proj", "attn_gate"):  # [H*2E, D] -> [D, H, E]
        qg = w.T.reshape(c.hidden_size, c.attn.num_heads, 2, c.attn.head_dim)
        return qg[:, :, 0 if module == "q_proj" else 1]
    if module == "conv":  # [C, 1, W] -> [W, C]
        return w[:, 0, :].T
    if module == "in_proj_z":  # [H_v*d_v, D] -> [D, H_v, d_v]
        return w.T.reshape(c.hidden_size, -1, c.linear.value_head_dim)
    if module == "out_proj":  # [D, H_v*d_v] -> [H_v, d_v, D]
        return w.T.reshape(-1, c.linear.value_head_dim, c.hidden_size)
    return w.T  # in_proj_qkv / b / a, the shared expert: [out, in] -> [in, out]


def _to_hf(w: np.ndarray, module: str, leaf: str, config: ModelConfig) -> np.ndarray:
    """Inverse of :func:`_to_ours` for one layer (``q_proj`` with its gate: :func:`gated_q_to_hf`)."""
    d = config.hidden_size
    if leaf in ("scale", "a_log", "dt_bias"):
        return w
    if module == "conv":  # [W, C] -> [C, 1, W]
        return w.T[:, None, :]
    if module == "in_proj_z":  # [D, H_v, d_v] -> [H_v*d_v, D]
        return w.reshape(d, -1).T
    if module == "out_proj":  # [H_v, d_v, D] -> [D, H_v*d_v]
        return w.reshape(-1, d).T
    return w.T


def gated_q_to_hf(q: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """Our q_proj and attn_gate ``[D, H, E]`` -> transformers' q_proj ``[H*2E, D]`` (per head,
    E query rows then E gate rows)."""
    d = q.shape[0]
    return np.stack([q, gate], axis=2).reshape(d, -1).T


def weights_from_hf(take: Take, sd: Mapping[str, Any], config: ModelConfig):
    """Qwen3.5's own layer tensors in our layout, each stacked over the layers its sub-tree
    holds: ``{module: {leaf: [L', ...]}}`` for :func:`own_weights` (``take(name, shape)``
    reads and checks a tensor of the state dict ``sd``)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for module, leaf in own_weights(config):
        per_layer = [
            _to_ours(
                take(
                    f"model.layers.{i}.{NAMES[(module, leaf)]}", _hf_shape(config, module, leaf, i)
                ),
                module,
                leaf,
                config,
            )
            for i in module_layers(config, module)
        ]
        out.setdefault(module, {})[leaf] = np.stack(per_layer, axis=0)
    return out


def weights_to_hf(layers: Mapping[str, Mapping[str, np.ndarray]], config: ModelConfig):
    """Inverse of :func:`weights_from_hf`: our stacked tensors of :func:`own_weights` as every
    layer's checkpoint tensors, name -> array (``q_proj`` and ``attn_gate`` as one)."""
    out: dict[str, np.ndarray] = {}
    for module, leaf in own_weights(config):
        if module == "attn_gate":  # written with q_proj
            continue
        stacked = layers[module][leaf]
        for j, i in enumerate(module_layers(config, module)):
            if module == "q_proj":
                w = gated_q_to_hf(stacked[j], layers["attn_gate"]["kernel"][j])
            else:
                w = _to_hf(stacked[j], module, leaf, config)
            out[f"model.layers.{i}.{NAMES[(module, leaf)]}"] = w
    return out
