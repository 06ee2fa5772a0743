"""Qwen3.5's own tensors between transformers' state dicts and our params tree: the Gated
DeltaNet (LINEAR) layers' names and layouts, which layers each stacked sub-tree holds, and the
attention output gate inside transformers' q_proj; the rest of the mapping is
:mod:`jaxrl_llm.interop.state_dict`'s.

Qwen3.5 (hybrid): a LINEAR layer's ``linear_attn.*`` tensors go to the sub-trees stacked over
the LINEAR layers only, the attention layers' ``self_attn.*`` to those stacked over the
attention layers (:func:`jaxrl_llm.models.layer_kinds`); ``self_attn.q_proj`` holds, per head,
the E query rows then the E output-gate rows (ours: ``q_proj`` and ``attn_gate``); the conv
``[C, 1, W]`` is ours ``[W, C]``.
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.models.config import LayerType, ModelConfig
from jaxrl_llm.models.layer_scan import layer_kinds

# Qwen3.5's Gated DeltaNet layers (config.is_hybrid) and the attention output gate, which
# transformers keeps in q_proj's rows: per head, E query rows then E gate rows.
LINEAR_NAMES: dict[tuple[str, str], str] = {
    ("in_proj_qkv", "kernel"): "linear_attn.in_proj_qkv.weight",
    ("in_proj_z", "kernel"): "linear_attn.in_proj_z.weight",
    ("in_proj_b", "kernel"): "linear_attn.in_proj_b.weight",
    ("in_proj_a", "kernel"): "linear_attn.in_proj_a.weight",
    ("conv", "kernel"): "linear_attn.conv1d.weight",
    ("delta", "a_log"): "linear_attn.A_log",
    ("delta", "dt_bias"): "linear_attn.dt_bias",
    ("linear_norm", "scale"): "linear_attn.norm.weight",
    ("out_proj", "kernel"): "linear_attn.out_proj.weight",
    ("attn_gate", "kernel"): "self_attn.q_proj.weight",
    ("shared_gate_proj", "kernel"): "mlp.shared_expert.gate_proj.weight",
    ("shared_up_proj", "kernel"): "mlp.shared_expert.up_proj.weight",
    ("shared_down_proj", "kernel"): "mlp.shared_expert.down_proj.weight",
    ("shared_expert_gate", "kernel"): "mlp.shared_expert_gate.weight",
}


def module_layers(config: ModelConfig, module: str) -> list[int]:
    """The transformers layer indices a stacked sub-tree of ``params["layers"]`` holds, in
    order: in a hybrid stack the LINEAR layers' or the attention layers' own, else all."""
    if not config.is_hybrid:
        return list(range(config.num_layers))
    kind = layer_kinds([module])[module]
    linear = [t == LayerType.LINEAR for t in config.attn.layer_types]
    if kind == "linear":
        return [i for i, is_lin in enumerate(linear) if is_lin]
    if kind == "attention":
        return [i for i, is_lin in enumerate(linear) if not is_lin]
    return list(range(config.num_layers))


#: The LINEAR layers' kernels whose transformers layout is not a plain ``nn.Linear`` transpose.
LINEAR_LAYOUTS = ("conv", "in_proj_z", "out_proj")


def linear_to_ours(w: np.ndarray, module: str, config: ModelConfig) -> np.ndarray:
    """One layer's transformers kernel -> ours, for :data:`LINEAR_LAYOUTS` and, with an output
    gate (``config.attn.output_gate``), ``q_proj`` / ``attn_gate`` (their rows of
    transformers' q_proj)."""
    c = config
    if module in ("q_proj", "attn_gate"):  # [H*2E, D] -> [D, H, E]
        qg = w.T.reshape(c.hidden_size, c.attn.num_heads, 2, c.attn.head_dim)
        return qg[:, :, 0 if module == "q_proj" else 1]
    if module == "conv":  # [C, 1, W] -> [W, C]
        return w[:, 0, :].T
    if module == "in_proj_z":  # [H_v*d_v, D] -> [D, H_v, d_v]
        return w.T.reshape(c.hidden_size, -1, c.linear.value_head_dim)
    if module == "out_proj":  # [D, H_v*d_v] -> [H_v, d_v, D]
        return w.T.reshape(-1, c.linear.value_head_dim, c.hidden_size)
    raise ValueError(f"{module!r} has no Qwen3.5 layout of its own")


def linear_to_hf(w: np.ndarray, module: str, config: ModelConfig) -> np.ndarray:
    """Inverse of :func:`linear_to_ours` for :data:`LINEAR_LAYOUTS` (a gated ``q_proj``:
    :func:`gated_q_to_hf`)."""
    d = config.hidden_size
    if module == "conv":  # [W, C] -> [C, 1, W]
        return w.T[:, None, :]
    if module == "in_proj_z":  # [D, H_v, d_v] -> [H_v*d_v, D]
        return w.reshape(d, -1).T
    if module == "out_proj":  # [H_v, d_v, D] -> [D, H_v*d_v]
        return w.reshape(-1, d).T
    raise ValueError(f"{module!r} has no Qwen3.5 layout of its own")


def gated_q_to_hf(q: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """Our q_proj and attn_gate ``[D, H, E]`` -> transformers' q_proj ``[H*2E, D]`` (per head,
    E query rows then E gate rows)."""
    d = q.shape[0]
    return np.stack([q, gate], axis=2).reshape(d, -1).T
