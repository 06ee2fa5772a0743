"""A quantised frozen base for LoRA (QLoRA): int8 and NF4 storage of the dense projections.

With ``model.lora.base_dtype: int8 | nf4`` the frozen base's seven dense projection kernels
(q, k, v, o, gate, up, down; every one the model has, adapted or not) are stored quantised;
norms, embeddings, biases and a mixture of experts' expert weights stay float (bfloat16). Each layer
dequantises its own kernels at the top of :func:`jaxrl_llm.models.layer.decoder_layer`, to the
activations' dtype. Under ``model.remat: dots | full`` the backward recomputes each layer and
dequantises again, so only one layer's float kernels exist at a time; with ``remat: none`` the
backward keeps every layer's dequantised kernels as residuals, as it keeps a float base's
per-layer casts to the compute dtype. The base is a frozen argument: no gradient
reaches it (:func:`dequantize_kernel` stops gradients too).

* **int8**: symmetric, one absmax scale per output channel (the reduction runs over the
  kernel's input dims): ``s = max|W[:, o]| / 127``, ``q = round(W / s)``, ``W ≈ q · s``; the
  error per element is at most ``s / 2``. Stored: 1 byte per weight + 4 bytes per output
  channel. The kernel becomes ``{"kernel_int8": int8 [same shape], "kernel_scale": float32
  [L, 1…, out…]}``.
* **nf4**: 4-bit NormalFloat of QLoRA (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of
  Quantized LLMs", https://arxiv.org/abs/2305.14314, §3): the 16 code values are quantiles of
  N(0, 1) normalised to [−1, 1] with an exact zero (8 positive quantiles of the upper half at
  probabilities ``linspace(δ, ½, 9)[:-1]``, 7 negative of the lower half at
  ``linspace(δ, ½, 8)[:-1]``, δ = ½(1 − 1/32 + 1 − 1/30) as in the reference implementation);
  blocks of 64 consecutive input elements of one output channel (PyTorch's row-major
  ``[out, in]`` blocks; here blocks run along the kernel's last input dim) are scaled by their
  absmax, each element is rounded to the nearest code, and two 4-bit codes are packed per
  uint8. Stored: ½ byte per weight + 4 bytes per block (0.5625 bytes/weight at block 64; the
  paper's double quantisation of the block scales is not done). An input dim that 64 does not
  divide uses its largest even divisor ≤ 64 as the block (a tiny test model's 48 → 48). The
  kernel becomes ``{"kernel_nf4": uint8 [L, …, in/2, out…], "kernel_absmax": float32
  [L, …, in/block, out…]}``.

Quantisation happens once, when the run builds its frozen base
(:func:`jaxrl_llm.train.programs.policy.policy_on_mesh`); merging the adapters
(:func:`jaxrl_llm.models.lora.merge_lora`: sampling, export) dequantises to bfloat16 first,
the dtype the rest of the base is held in (the sampler's copy is then the size a bfloat16
base gives).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: The frozen base's storage choices (``model.lora.base_dtype``); float32 is the default.
BASE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "int8", "nf4")
QUANTIZED: tuple[str, ...] = ("int8", "nf4")
NF4_BLOCK = 64

# projection name -> number of input dims after the leading layers axis (the LoRA targets).
PROJECTION_IN_DIMS = {
    "q_proj": 1,
    "k_proj": 1,
    "v_proj": 1,
    "o_proj": 2,
    "gate_proj": 1,
    "up_proj": 1,
    "down_proj": 1,
}


@functools.cache
def nf4_code_book() -> np.ndarray:
    """The 16 NF4 values, ascending, in [−1, 1] with an exact 0 (QLoRA §3: quantiles of
    N(0, 1), 8 from the upper half and 7 from the lower, normalised by the largest)."""
    from scipy.stats import norm

    delta = 0.5 * ((1 - 1 / 32) + (1 - 1 / 30))
    pos = norm.ppf(np.linspace(delta, 0.5, 9)[:-1])
    neg = -norm.ppf(np.linspace(delta, 0.5, 8)[:-1])
    v = np.sort(np.concatenate([pos, [0.0], neg]))
    return (v / v.max()).astype(np.float32)


def nf4_block(n: int) -> int:
    """The NF4 block along an input dim of size ``n``: 64, or the largest even divisor of ``n``
    ≤ 64 when 64 does not divide it.

    Raises:
      ValueError: ``n`` is odd (two codes are packed per byte along this dim).
    """
    if n % 2:
        raise ValueError(f"nf4 needs an even input dim to pack two 4-bit codes per byte, got {n}")
    return max(b for b in range(2, min(NF4_BLOCK, n) + 1, 2) if n % b == 0)


def quantize_int8(w: jax.Array, n_in: int) -> dict:
    """``{"kernel_int8", "kernel_scale"}`` of a stacked kernel ``w`` ``[L, in…, out…]``
    (``n_in`` input dims): per-output-channel absmax scales, values rounded to nearest."""
    axes = tuple(range(1, 1 + n_in))
    w = w.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(w), axis=axes, keepdims=True)
    scale = jnp.where(absmax > 0, absmax / 127.0, 1.0)
    q = jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8)
    return {"kernel_int8": q, "kernel_scale": scale}


def quantize_nf4(w: jax.Array, n_in: int) -> dict:
    """``{"kernel_nf4", "kernel_absmax"}`` of a stacked kernel ``w`` ``[L, in…, out…]``:
    blockwise absmax along the last input dim (axis ``n_in``), each scaled value rounded to the
    nearest NF4 code, two codes per uint8 (the even element in the low nibble)."""
    ax = n_in
    n = w.shape[ax]
    block = nf4_block(n)
    w = w.astype(jnp.float32)
    blocks = w.reshape(*w.shape[:ax], n // block, block, *w.shape[ax + 1 :])
    absmax = jnp.max(jnp.abs(blocks), axis=ax + 1, keepdims=True)
    x = blocks / jnp.where(absmax > 0, absmax, 1.0)
    codes_f = jnp.asarray(nf4_code_book())
    # nearest code: the midpoints between neighbouring codes split [-1, 1] into 16 cells
    codes = jnp.searchsorted((codes_f[1:] + codes_f[:-1]) / 2, x).astype(jnp.uint8)
    pairs = codes.reshape(*w.shape[:ax], n // 2, 2, *w.shape[ax + 1 :])
    lo, hi = jnp.take(pairs, 0, axis=ax + 1), jnp.take(pairs, 1, axis=ax + 1)
    return {"kernel_nf4": lo | (hi << 4), "kernel_absmax": jnp.squeeze(absmax, ax + 1)}


def _dequantize_nf4(packed: jax.Array, absmax: jax.Array, ax: int) -> jax.Array:
    """Float32 values of packed NF4 codes (``ax``: the packed input axis)."""
    lo, hi = packed & 0xF, packed >> 4
    codes = jnp.stack([lo, hi], axis=ax + 1)
    n = packed.shape[ax] * 2
    block = n // absmax.shape[ax]
    v = jnp.asarray(nf4_code_book())[codes.astype(jnp.int32)]
    shape = (*packed.shape[:ax], n // block, block, *packed.shape[ax + 1 :])
    w = v.reshape(shape) * jnp.expand_dims(absmax, ax + 1)
    return w.reshape(*packed.shape[:ax], n, *packed.shape[ax + 1 :])


def is_quantized(p: Any) -> bool:
    """Whether a projection's parameter dict holds a quantised kernel."""
    return isinstance(p, dict) and ("kernel_int8" in p or "kernel_nf4" in p)


def dequantize_kernel(p: dict, n_in: int, dtype: Any, *, stacked: bool) -> jax.Array:
    """The float kernel of a quantised projection dict ``p`` in ``dtype`` (``stacked``: its
    arrays carry the leading layers axis), with no gradient into the stored base."""
    lead = 1 if stacked else 0
    if "kernel_int8" in p:
        w = p["kernel_int8"].astype(jnp.float32) * p["kernel_scale"]
    else:
        w = _dequantize_nf4(p["kernel_nf4"], p["kernel_absmax"], lead + n_in - 1)
    return jax.lax.stop_gradient(w.astype(dtype))


def _entries(p: dict) -> dict:
    """``p`` without its quantised kernel entries."""
    drop = ("kernel_int8", "kernel_scale", "kernel_nf4", "kernel_absmax")
    return {k: v for k, v in p.items() if k not in drop}


def dequantize_layer(lp: dict, dtype: Any) -> dict:
    """One layer's parameters (a slice of ``params["layers"]``) with every quantised projection
    back as a float ``kernel`` in ``dtype``; ``lp`` itself when nothing is quantised (the
    hook :func:`~jaxrl_llm.models.layer.decoder_layer` calls)."""
    names = [k for k, p in lp.items() if k in PROJECTION_IN_DIMS and is_quantized(p)]
    if not names:
        return lp
    out = dict(lp)
    for k in names:
        w = dequantize_kernel(lp[k], PROJECTION_IN_DIMS[k], dtype, stacked=False)
        out[k] = {**_entries(lp[k]), "kernel": w}
    return out


def holds_quantized(layers: Any) -> bool:
    """Whether ``params["layers"]`` holds a quantised projection."""
    return isinstance(layers, dict) and any(is_quantized(p) for p in layers.values())


def quantize_base(params: dict, base_dtype: str) -> dict:
    """The frozen base stored as ``base_dtype``: float32 / bfloat16 cast every float leaf;
    int8 / nf4 quantise the dense projection kernels (:data:`PROJECTION_IN_DIMS`) and store
    the rest (embeddings, norms, biases, experts) in bfloat16, as QLoRA keeps them in the
    16-bit compute dtype.

    Raises:
      ValueError: an unknown ``base_dtype``.
    """
    if base_dtype not in BASE_DTYPES:
        raise ValueError(f"unknown base dtype {base_dtype!r}; allowed: {list(BASE_DTYPES)}")
    dt = jnp.dtype(base_dtype if base_dtype not in QUANTIZED else "bfloat16")

    def cast(tree):
        return jax.tree.map(
            lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
        )

    if base_dtype not in QUANTIZED:
        return cast(params)
    fn = quantize_int8 if base_dtype == "int8" else quantize_nf4
    quantized = {}
    for name, n_in in PROJECTION_IN_DIMS.items():
        p = params["layers"].get(name)
        if isinstance(p, dict) and "kernel" in p:
            rest = cast({k: v for k, v in p.items() if k != "kernel"})
            quantized[name] = {**rest, **fn(p["kernel"], n_in)}
    others = {k: v for k, v in params["layers"].items() if k not in quantized}
    out = cast({**params, "layers": others})
    return {**out, "layers": {**out["layers"], **quantized}}


def dequantize_base(params: dict, dtype: Any = jnp.bfloat16) -> dict:
    """The float tree of a (possibly) quantised base: each quantised projection's kernel
    dequantised to ``dtype`` (default bfloat16, the dtype :func:`quantize_base` keeps the
    rest in); other leaves unchanged."""
    layers = dict(params["layers"])
    for name, p in layers.items():
        if name in PROJECTION_IN_DIMS and is_quantized(p):
            w = dequantize_kernel(p, PROJECTION_IN_DIMS[name], dtype, stacked=True)
            layers[name] = {**_entries(p), "kernel": w}
    return {**params, "layers": layers}


def quantized_logical_axes(axes: dict, base_dtype: str) -> dict:
    """The logical axes of :func:`quantize_base`'s tree from the float tree's ``axes``: the
    quantised entries keep their kernel's axes (an int8 scale and an NF4 block scale have the
    kernel's rank; their size-1 or shortened dims take the same names)."""
    if base_dtype not in QUANTIZED:
        return axes
    names = (
        ("kernel_int8", "kernel_scale") if base_dtype == "int8" else ("kernel_nf4", "kernel_absmax")
    )
    layers = dict(axes["layers"])
    for name in PROJECTION_IN_DIMS:
        p = layers.get(name)
        if isinstance(p, dict) and "kernel" in p:
            rest = {k: v for k, v in p.items() if k != "kernel"}
            layers[name] = {**rest, names[0]: p["kernel"], names[1]: p["kernel"]}
    return {**axes, "layers": layers}


def kernel_bytes(shape: tuple[int, ...], n_in: int, base_dtype: str) -> float:
    """Stored bytes of one stacked projection kernel ``[L, in…, out…]`` (``n_in`` input dims)
    held as ``base_dtype``: 4 / 2 bytes per weight (float32 / bfloat16), 1 + a float32 scale
    per output channel (int8), ½ + a float32 absmax per block (nf4)."""
    size = math.prod(shape)
    if base_dtype == "int8":
        return size + 4 * size / math.prod(shape[1 : 1 + n_in])
    if base_dtype == "nf4":
        return size / 2 + 4 * size / nf4_block(shape[n_in])
    return float(size * jnp.dtype(base_dtype).itemsize)
