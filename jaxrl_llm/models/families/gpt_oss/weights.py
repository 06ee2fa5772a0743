"""gpt-oss's weight names and layouts between transformers' state dicts and our params tree,
both ways (:func:`weights_from_hf`, :func:`weights_to_hf`), for the tensors that are gpt-oss's
own; the attention projections and norms it shares with Llama are mapped by
:mod:`jaxrl_llm.interop.state_dict`, which asks this module through
:mod:`jaxrl_llm.models.families.registry`.

transformers' ``GptOssForCausalLM`` (what ``save_pretrained`` of an unquantised model writes,
and what export writes), inside ``model.layers.{i}.``:

- ``self_attn.sinks`` ``[H]`` → ``sinks/logit``; ``self_attn.o_proj.bias`` ``[D]`` →
  ``o_proj/bias``;
- ``mlp.router.weight`` ``[X, D]`` / ``.bias`` ``[X]`` → ``router/kernel`` ``[D, X]`` /
  ``router/bias``;
- ``mlp.experts.gate_up_proj`` ``[X, D, 2·F_e]`` (input first; gate and up *interleaved*:
  columns 0, 2, 4, … gate, 1, 3, 5, … up) and ``gate_up_proj_bias`` ``[X, 2·F_e]`` →
  ``experts_gate`` / ``experts_up`` ``[X, D, F_e]`` and their biases;
  ``mlp.experts.down_proj`` ``[X, F_e, D]`` / ``down_proj_bias`` ``[X, D]`` → ``experts_down``.

The released checkpoints (openai/gpt-oss-20b, -120b) store the expert kernels in MXFP4
(Open Compute Project, "OCP Microscaling Formats (MX) v1.0", 2023): ``{gate_up,down}_proj_blocks``
``[X, out, G, 16]`` uint8, two 4-bit E2M1 values a byte (low nibble first), and
``{gate_up,down}_proj_scales`` ``[X, out, G]`` uint8, one power-of-two exponent (bias 127) per
block of 32 values along the input dim. Import dequantises them to float32
(:func:`dequantize_mxfp4`) and warns that it did; export writes float kernels (no
``quantization_config``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxrl_llm.models.config import ModelConfig

#: The (module, leaf) pairs of ``params["layers"]`` this module maps; the rest are the shared
#: mapping's.
LAYER_WEIGHTS = frozenset(
    {
        ("sinks", "logit"),
        ("o_proj", "bias"),
        ("router", "kernel"),
        ("router", "bias"),
        ("experts_gate", "kernel"),
        ("experts_gate", "bias"),
        ("experts_up", "kernel"),
        ("experts_up", "bias"),
        ("experts_down", "kernel"),
        ("experts_down", "bias"),
    }
)

#: The E2M1 (FP4) code points, indexed by the 4-bit code (sign in bit 3).
FP4_VALUES = np.asarray(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)
MXFP4_BLOCK = 32  # values per shared exponent


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 ``blocks`` ``[..., out, G, 16]`` uint8 and ``scales`` ``[..., out, G]`` uint8 →
    float32 ``[..., in, out]`` (in = 32·G; the expert kernels' input-first layout): value
    ``FP4[code] · 2^(scale − 127)``, the byte's low nibble the even element, its high nibble the
    odd one."""
    blocks = np.asarray(blocks, np.uint8)
    scales = np.asarray(scales, np.uint8)
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] * 2 != MXFP4_BLOCK:
        raise ValueError(
            f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not match "
            f"([..., out, G, 16] and [..., out, G])"
        )
    values = np.empty((*blocks.shape[:-1], MXFP4_BLOCK), np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    out = values.reshape(*scales.shape[:-1], -1)  # [..., out, in]
    return np.swapaxes(out, -1, -2)


Take = Callable[..., np.ndarray]


def _expert_kernel(take: Take, sd: Mapping[str, Any], name: str, shape: tuple[int, ...]):
    """One layer's expert kernel ``[X, in, out]`` from its float tensor or its MXFP4 blocks
    and scales; (array, whether it was quantised)."""
    if f"{name}_blocks" in sd:
        x, d_in, d_out = shape
        g = d_in // MXFP4_BLOCK
        blocks = take(f"{name}_blocks", (x, d_out, g, MXFP4_BLOCK // 2), packed=True)
        scales = take(f"{name}_scales", (x, d_out, g), packed=True)
        return dequantize_mxfp4(blocks, scales), True
    return take(name, shape), False


def weights_from_hf(take: Take, sd: Mapping[str, Any], config: ModelConfig):
    """gpt-oss's own layer tensors in our layout, stacked over the layers:
    ``{module: {leaf: [L, ...]}}`` for :data:`LAYER_WEIGHTS` (``take(name, shape, packed=)``
    reads and checks a tensor of the state dict ``sd``; ``packed`` allows uint8)."""
    c = config
    x, d, f, h = c.moe.num_experts, c.hidden_size, c.moe.intermediate_size, c.attn.num_heads
    per_layer: list[dict[tuple[str, str], np.ndarray]] = []
    quantised = False
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        gate_up, q1 = _expert_kernel(take, sd, f"{p}mlp.experts.gate_up_proj", (x, d, 2 * f))
        down, q2 = _expert_kernel(take, sd, f"{p}mlp.experts.down_proj", (x, f, d))
        quantised |= q1 or q2
        gate_up_b = take(f"{p}mlp.experts.gate_up_proj_bias", (x, 2 * f))
        per_layer.append(
            {
                ("sinks", "logit"): take(f"{p}self_attn.sinks", (h,)),
                ("o_proj", "bias"): take(f"{p}self_attn.o_proj.bias", (d,)),
                ("router", "kernel"): take(f"{p}mlp.router.weight", (x, d)).T,
                ("router", "bias"): take(f"{p}mlp.router.bias", (x,)),
                ("experts_gate", "kernel"): gate_up[..., 0::2],
                ("experts_up", "kernel"): gate_up[..., 1::2],
                ("experts_gate", "bias"): gate_up_b[:, 0::2],
                ("experts_up", "bias"): gate_up_b[:, 1::2],
                ("experts_down", "kernel"): down,
                ("experts_down", "bias"): take(f"{p}mlp.experts.down_proj_bias", (x, d)),
            }
        )
    if quantised:
        warnings.warn(
            "gpt-oss: the MXFP4 expert weights were dequantised to float32 on import "
            "(export writes them unquantised)",
            UserWarning,
            stacklevel=2,
        )
    out: dict[str, dict[str, np.ndarray]] = {}
    for module, leaf in sorted(LAYER_WEIGHTS):
        out.setdefault(module, {})[leaf] = np.stack([w[(module, leaf)] for w in per_layer])
    return out


def weights_to_hf(layers: Mapping[str, Mapping[str, np.ndarray]], config: ModelConfig):
    """Inverse of :func:`weights_from_hf`: our stacked tensors of :data:`LAYER_WEIGHTS` as
    every layer's checkpoint tensors (unquantised), name -> array."""

    def interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        both = np.empty((*gate.shape[:-1], 2 * gate.shape[-1]), gate.dtype)
        both[..., 0::2], both[..., 1::2] = gate, up
        return both

    out: dict[str, np.ndarray] = {}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."

        def at(module: str, leaf: str, i: int = i) -> np.ndarray:
            return np.asarray(layers[module][leaf][i])

        out[f"{p}self_attn.sinks"] = at("sinks", "logit")
        out[f"{p}self_attn.o_proj.bias"] = at("o_proj", "bias")
        out[f"{p}mlp.router.weight"] = at("router", "kernel").T
        out[f"{p}mlp.router.bias"] = at("router", "bias")
        out[f"{p}mlp.experts.gate_up_proj"] = interleave(
            at("experts_gate", "kernel"), at("experts_up", "kernel")
        )
        out[f"{p}mlp.experts.gate_up_proj_bias"] = interleave(
            at("experts_gate", "bias"), at("experts_up", "bias")
        )
        out[f"{p}mlp.experts.down_proj"] = at("experts_down", "kernel")
        out[f"{p}mlp.experts.down_proj_bias"] = at("experts_down", "bias")
    return out
