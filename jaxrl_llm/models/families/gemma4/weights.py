"""Gemma 4's weight names and layouts between transformers' state dicts and our params tree,
both ways (:func:`weights_from_hf`, :func:`weights_to_hf`), for the tensors that are Gemma 4's
own: the MoE block beside the MLP (``enable_moe_block``; the 26B-A4B model), its router, fused
experts and the router's scales and norms. The attention, the MLP and the norms it shares with
Gemma 3 are mapped by :mod:`jaxrl_llm.interop.state_dict` (their head padding, the tensors that
KV-shared layers lack and the per-layer inputs by :mod:`jaxrl_llm.interop.state_dict_gemma4`,
on the config's features), which asks this module through
:mod:`jaxrl_llm.models.families.registry`.

transformers' ``Gemma4ForCausalLM``, inside ``model.layers.{i}.``: ``router.proj.weight``
``[X, D]`` → ``router/kernel`` ``[D, X]``; ``experts.gate_up_proj`` ``[X, 2·F_e, D]`` (gate rows
first) → ``experts_gate`` / ``experts_up`` ``[X, D, F_e]``; ``experts.down_proj`` ``[X, D, F_e]``
→ ``experts_down`` ``[X, F_e, D]``; ``router.scale`` ``[D]``, ``router.per_expert_scale``
``[X]`` and the three norms ``post_feedforward_layernorm_1``, ``pre_feedforward_layernorm_2``,
``post_feedforward_layernorm_2`` ``[D]`` as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.params import param_shapes_and_axes

#: The router's scales and the norms of the MoE block beside the MLP: (our layer sub-tree,
#: leaf) -> transformers' name inside ``model.layers.{i}.``.
BESIDE_MLP_NAMES: dict[tuple[str, str], str] = {
    ("router_norm", "scale"): "router.scale",
    ("expert_scale", "scale"): "router.per_expert_scale",
    ("post_dense_norm", "scale"): "post_feedforward_layernorm_1.weight",
    ("moe_norm", "scale"): "pre_feedforward_layernorm_2.weight",
    ("post_moe_norm", "scale"): "post_feedforward_layernorm_2.weight",
}
#: The router and the experts (fused in transformers' layout).
EXPERT_WEIGHTS = (
    ("router", "kernel"),
    ("experts_gate", "kernel"),
    ("experts_up", "kernel"),
    ("experts_down", "kernel"),
)
#: The (module, leaf) pairs of ``params["layers"]`` this module maps; the rest are the shared
#: mapping's.
LAYER_WEIGHTS = frozenset({*EXPERT_WEIGHTS, *BESIDE_MLP_NAMES})

Take = Callable[..., np.ndarray]


def own_weights(config: ModelConfig) -> list[tuple[str, str]]:
    """The pairs of :data:`LAYER_WEIGHTS` that ``config``'s params tree has (none without the
    MoE block)."""
    layers = param_shapes_and_axes(config)["layers"]
    return [(m, leaf) for m, leaf in sorted(LAYER_WEIGHTS) if leaf in layers.get(m, {})]


def _experts_from_hf(take: Take, i: int, config: ModelConfig) -> dict[str, np.ndarray]:
    """Layer ``i``'s router and experts in our layout (no layer axis)."""
    c = config
    x, d, f = c.moe.num_experts, c.hidden_size, c.moe.intermediate_size
    layer = f"model.layers.{i}."
    gate_up = take(f"{layer}experts.gate_up_proj", (x, 2 * f, d))
    return {
        "router": take(f"{layer}router.proj.weight", (x, d)).T,
        "experts_gate": gate_up[:, :f, :].transpose(0, 2, 1),
        "experts_up": gate_up[:, f:, :].transpose(0, 2, 1),
        "experts_down": take(f"{layer}experts.down_proj", (x, d, f)).transpose(0, 2, 1),
    }


def _beside_mlp_shape(config: ModelConfig, module: str) -> tuple[int, ...]:
    return (config.moe.num_experts,) if module == "expert_scale" else (config.hidden_size,)


def weights_from_hf(take: Take, sd: Mapping[str, Any], config: ModelConfig):
    """Gemma 4's own layer tensors in our layout, stacked over the layers:
    ``{module: {leaf: [L, ...]}}`` for :func:`own_weights` (``take(name, shape)`` reads and
    checks a tensor of the state dict ``sd``)."""
    own = own_weights(config)
    out: dict[str, dict[str, np.ndarray]] = {}
    if ("router", "kernel") in own:
        per_layer = [_experts_from_hf(take, i, config) for i in range(config.num_layers)]
        for module, _ in EXPERT_WEIGHTS:
            out[module] = {"kernel": np.stack([m[module] for m in per_layer])}
    for (module, leaf), name in BESIDE_MLP_NAMES.items():
        if (module, leaf) not in own:
            continue
        shape = _beside_mlp_shape(config, module)
        out[module] = {
            leaf: np.stack(
                [take(f"model.layers.{i}.{name}", shape) for i in range(config.num_layers)]
            )
        }
    return out


def weights_to_hf(layers: Mapping[str, Mapping[str, np.ndarray]], config: ModelConfig):
    """Inverse of :func:`weights_from_hf`: our stacked tensors of :func:`own_weights` as every
    layer's checkpoint tensors, name -> array."""
    own = own_weights(config)
    out: dict[str, np.ndarray] = {}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        if ("router", "kernel") in own:
            gate = layers["experts_gate"]["kernel"][i]
            up = layers["experts_up"]["kernel"][i]
            out[f"{p}router.proj.weight"] = layers["router"]["kernel"][i].T
            out[f"{p}experts.gate_up_proj"] = np.concatenate(
                [gate.transpose(0, 2, 1), up.transpose(0, 2, 1)], axis=1
            )
            out[f"{p}experts.down_proj"] = layers["experts_down"]["kernel"][i].transpose(0, 2, 1)
        for (module, leaf), name in BESIDE_MLP_NAMES.items():
            if (module, leaf) in own:
                out[f"{p}{name}"] = layers[module][leaf][i]
    return out
