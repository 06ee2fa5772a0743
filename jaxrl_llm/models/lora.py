"""LoRA as a transformation of the parameter pytree.

Low-rank adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
https://arxiv.org/abs/2106.09685): for a frozen kernel W (input dims → output dims) the
adapted kernel is  W' = W + (α / r) · A B  with A ``[L, in, r]`` (random, std 1/r... see
:func:`init_lora`) and B ``[L, r, out]`` (zeros), so training starts exactly at the base model.

The adapters live in their own small tree, applied in one of two ways:

* :func:`attach_lora` (training) puts A and (α/r)·B beside each kernel; the model computes
  ``x W + (x A) B``. Differentiating with respect to the adapters then never forms the
  full-size weight gradient ``xᵀ dy`` of a frozen kernel: the backward is the input gradient
  plus rank-r products, about 2/3 of full fine-tuning's matmul FLOPs (the "~67% of the compute"
  of Schulman et al. 2025, "LoRA Without Regret", Thinking Machines Lab), and the optimizer
  touches only the adapters.
* :func:`merge_lora` (sampling, evaluation, export) returns an ordinary parameter tree with
  W' = W + (α/r)·A B: one matmul per projection at decode time.

The base stays a frozen argument, and "the reference model" is simply the base tree (adapters
off) — no second copy of the weights. Export merges the adapters into the kernels.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.models import quant
from jaxrl_llm.models.config import ModelConfig

# kernel name -> number of input dims after the leading layers axis.
_IN_DIMS = quant.PROJECTION_IN_DIMS
ALL_TARGETS: tuple[str, ...] = tuple(_IN_DIMS)

_IN_AXES = {
    "q_proj": ("embed",),
    "k_proj": ("embed",),
    "v_proj": ("embed",),
    "o_proj": ("heads", "head_dim"),
    "gate_proj": ("embed",),
    "up_proj": ("embed",),
    "down_proj": ("mlp",),
}
_OUT_AXES = {
    "q_proj": ("heads", "head_dim"),
    "k_proj": ("kv_heads", "head_dim"),
    "v_proj": ("kv_heads", "head_dim"),
    "o_proj": ("embed",),
    "gate_proj": ("mlp",),
    "up_proj": ("mlp",),
    "down_proj": ("embed",),
}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LoRAConfig:
    """Adapter hyperparameters.

    Attributes:
      rank: r ≥ 1. alpha: scale numerator; the update is (alpha / rank) · A B (the paper's
        convention; alpha = 2r is a common choice, default 16 with r = 8).
      targets: which projections get adapters (default all seven of attention and MLP).
      base_dtype: how the frozen base is stored: float32 (default), bfloat16, or quantised
        int8 / nf4 (QLoRA, :mod:`jaxrl_llm.models.quant`: the seven dense projections
        quantised, dequantised per layer in the forward).
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ALL_TARGETS
    base_dtype: str = "float32"

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        object.__setattr__(self, "targets", tuple(self.targets))
        unknown = [t for t in self.targets if t not in _IN_DIMS]
        if unknown:
            raise ValueError(f"unknown LoRA targets {unknown}; allowed: {list(ALL_TARGETS)}")
        if self.base_dtype not in quant.BASE_DTYPES:
            raise ValueError(
                f"unknown LoRA base_dtype {self.base_dtype!r}; allowed: {list(quant.BASE_DTYPES)}"
            )

    @property
    def scale(self) -> float:
        """α / r."""
        return self.alpha / self.rank


def _in_out(shape: tuple[int, ...], name: str) -> tuple[int, int]:
    k = _IN_DIMS[name]
    return math.prod(shape[1 : 1 + k]), math.prod(shape[1 + k :])


def init_lora(config: ModelConfig, lora: LoRAConfig, rng: jax.Array, *, base_shapes=None) -> dict:
    """Adapters ``{"layers": {name: {"a": [L, in, r], "b": [L, r, out]}}}`` in float32.

    A ~ N(0, 1/in) (Kaiming-style, so A x has unit scale), B = 0: the adapted model equals the
    base at initialisation.

    Raises:
      ValueError: a target the model does not have (a mixture of experts has no dense
        gate / up / down projection; its experts take no adapters).
    """
    from jaxrl_llm.models.params import param_shapes_and_axes

    specs = param_shapes_and_axes(config)["layers"]
    missing = [t for t in lora.targets if t not in specs]
    if missing:
        raise ValueError(
            f"LoRA targets {missing} are not projections of this {config.family.value} model "
            f"(a mixture of experts' experts take no adapters); use targets from "
            f"{[t for t in ALL_TARGETS if t in specs]}"
        )
    out: dict[str, Any] = {}
    keys = jax.random.split(rng, len(lora.targets))
    for key, name in zip(keys, lora.targets):
        shape = specs[name]["kernel"][0]
        fan_in, fan_out = _in_out(shape, name)
        L = shape[0]
        out[name] = {
            "a": jax.random.normal(key, (L, fan_in, lora.rank), jnp.float32) / math.sqrt(fan_in),
            "b": jnp.zeros((L, lora.rank, fan_out), jnp.float32),
        }
    return {"layers": out}


def lora_logical_axes(lora: LoRAConfig) -> dict:
    """Logical axes of the adapter tree (A: layers, lora_in, lora_rank; B: …, lora_out)."""
    return {
        "layers": {
            name: {
                "a": ("layers", "lora_in", "lora_rank"),
                "b": ("layers", "lora_rank", "lora_out"),
            }
            for name in lora.targets
        }
    }


def merge_lora(base: dict, adapters: dict, lora: LoRAConfig) -> dict:
    """W' = W + (α/r)·A B for every adapted kernel; returns a new params tree (base untouched).

    The merged kernel takes the base kernel's dtype; the product is computed in float32. A
    quantised base (:mod:`jaxrl_llm.models.quant`) is dequantised to bfloat16 first (the dtype
    it keeps its other weights in): the result is an ordinary bfloat16 tree.
    """
    layers = dict(quant.dequantize_base(base)["layers"])
    for name, ab in adapters["layers"].items():
        w = layers[name]["kernel"]
        delta = (
            jnp.einsum("lir,lro->lio", ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32))
            * lora.scale
        )
        layers[name] = {
            **layers[name],
            "kernel": (w.astype(jnp.float32) + delta.reshape(w.shape)).astype(w.dtype),
        }
    return {**base, "layers": layers}


def attach_lora(base: dict, adapters: dict, lora: LoRAConfig) -> dict:
    """The base tree with each adapted projection's dict extended by ``lora_a`` ``[L, in, r]``
    and ``lora_b`` = (α/r)·B ``[L, r, out]``; :func:`jaxrl_llm.models.apply` adds ``(x A) B`` to
    the projection. Same function as :func:`merge_lora`'s tree (up to rounding), cheaper to
    differentiate: no kernel-sized product or gradient is formed.
    """
    layers = dict(base["layers"])
    for name, ab in adapters["layers"].items():
        layers[name] = {**layers[name], "lora_a": ab["a"], "lora_b": ab["b"] * lora.scale}
    return {**base, "layers": layers}
