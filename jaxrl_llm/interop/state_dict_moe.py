"""A mixture of experts' router and experts between transformers' state dicts and our params
tree, every layer's stacked (:func:`experts_from_hf`, :func:`experts_to_hf`): Qwen3-MoE,
Mixtral and Qwen3.5-MoE, under the per-expert names their entries give
(:attr:`~jaxrl_llm.models.families.registry.FamilyEntry.expert_names`; a family that maps its
experts itself, gpt-oss or Gemma 4, does so through its entry's weights). The rest of the
mapping is :mod:`jaxrl_llm.interop.state_dict`'s.

Mixture of experts (Qwen3-MoE, Mixtral): checkpoints store one ``nn.Linear`` per expert, under
``mlp.experts.{j}.{gate,up,down}_proj`` (Qwen3-MoE) or ``block_sparse_moe.experts.{j}.w1 / w3
/ w2`` (Mixtral: gate / up / down), with the router at ``mlp.gate`` / ``block_sparse_moe.gate``;
that is what ``save_pretrained`` writes and what export writes. transformers ≥ 5 holds them
fused in memory (``mlp.experts.gate_up_proj`` ``[X, 2·F_e, D]``, gate rows first, and
``mlp.experts.down_proj`` ``[X, D, F_e]``, router ``mlp.gate.weight``); import reads either.
Ours: ``router`` ``[L, D, X]``, ``experts_gate`` / ``experts_up`` ``[L, X, D, F_e]``,
``experts_down`` ``[L, X, F_e, D]``; Qwen3.5-MoE's shared expert ``mlp.shared_expert.*`` and
``mlp.shared_expert_gate`` are ``shared_{gate,up,down}_proj`` and ``shared_expert_gate``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from jaxrl_llm.errors import ModelLoadError
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.families.registry import entry_of

# Our expert sub-trees; read and written by experts_from_hf / experts_to_hf.
MOE_MODULES = ("router", "experts_gate", "experts_up", "experts_down")


def _expert_names(config: ModelConfig) -> tuple[str, str, str, str]:
    """(block prefix, gate, up, down) of ``config``'s family's per-expert checkpoint names.

    Raises:
      ModelLoadError: the family has no experts in transformers (a Llama config given experts).
    """
    names = entry_of(config.family).expert_names
    if names is None:
        raise ModelLoadError(
            f"a {config.family.value} config with experts has no transformers expert weights "
            f"(use family 'qwen3_moe' or 'mixtral')"
        )
    return names


def _stack_index_from_hf(take, sd, i: int, config: ModelConfig) -> dict[str, np.ndarray]:
    """Layer ``i``'s router and experts in our layout, from the per-expert checkpoint layout
    or transformers' fused in-memory one (``take(name, shape)`` reads and checks a tensor)."""
    c = config
    x, d, f = c.moe.num_experts, c.hidden_size, c.moe.intermediate_size
    layer = f"model.layers.{i}."
    block, gate, up, down = _expert_names(c)
    fused = f"{layer}mlp.experts.gate_up_proj"
    if fused in sd:
        gate_up = take(fused, (x, 2 * f, d))
        return {
            "router": take(f"{layer}mlp.gate.weight", (x, d)).T,
            "experts_gate": gate_up[:, :f, :].transpose(0, 2, 1),
            "experts_up": gate_up[:, f:, :].transpose(0, 2, 1),
            "experts_down": take(f"{layer}mlp.experts.down_proj", (x, d, f)).transpose(0, 2, 1),
        }
    prefix = f"{layer}{block}."

    def experts(name: str, shape: tuple[int, int]) -> np.ndarray:
        return np.stack([take(f"{prefix}experts.{j}.{name}.weight", shape).T for j in range(x)])

    return {
        "router": take(f"{prefix}gate.weight", (x, d)).T,
        "experts_gate": experts(gate, (f, d)),
        "experts_up": experts(up, (f, d)),
        "experts_down": experts(down, (d, f)),
    }


def _stack_index_to_hf(layer: Mapping[str, np.ndarray], i: int, config: ModelConfig):
    """Layer ``i``'s router and experts (ours, no layer axis) in the per-expert checkpoint
    layout: name -> array."""
    block, gate, up, down = _expert_names(config)
    prefix = f"model.layers.{i}.{block}."
    out = {f"{prefix}gate.weight": layer["router"].T}
    for j in range(config.moe.num_experts):
        out[f"{prefix}experts.{j}.{gate}.weight"] = layer["experts_gate"][j].T
        out[f"{prefix}experts.{j}.{up}.weight"] = layer["experts_up"][j].T
        out[f"{prefix}experts.{j}.{down}.weight"] = layer["experts_down"][j].T
    return out


def experts_from_hf(take, sd, config: ModelConfig) -> dict[str, dict[str, np.ndarray]]:
    """Every layer's router and experts in our layout, stacked over the layers:
    ``{module: {"kernel": [L, ...]}}`` for each of :data:`MOE_MODULES` (``take(name, shape)``
    reads and checks a tensor of the state dict ``sd``)."""
    per_layer_moe = [_stack_index_from_hf(take, sd, i, config) for i in range(config.num_layers)]
    return {
        module: {"kernel": np.stack([m[module] for m in per_layer_moe])} for module in MOE_MODULES
    }


def experts_to_hf(stacked: Mapping[str, np.ndarray], config: ModelConfig) -> dict[str, np.ndarray]:
    """Inverse of :func:`experts_from_hf`: our stacked ``module -> [L, ...]`` kernels as every
    layer's checkpoint tensors, name -> array."""
    out: dict[str, np.ndarray] = {}
    for i in range(config.num_layers):
        out.update(_stack_index_to_hf({m: w[i] for m, w in stacked.items()}, i, config))
    return out
