"""The padded head layout of a stack whose layers differ in attention geometry (Gemma 4's
sliding and full-attention layers; ``ModelConfig.has_padded_heads``).

Every layer of our stack runs one compiled body over stacked weights, so layers must share
shapes. A layer whose head dim E or KV-head count K is smaller
than the widest (E* = max(E_sliding, E_global), K* likewise) stores its q/k/v/o weights padded
with zeros to E* and K*: head dim i < E/2 at slot i, i ≥ E/2 at slot E*/2 + (i − E/2) (each
RoPE half padded at its end, so "rotate half" over E* pairs slot i with i + E*/2 as it paired
dim i with i + E/2); KV heads in the first K slots. In the forward, the per-head norms divide
by the layer's own E, the RoPE table of the layer holds zeros past its frequencies, and the K*
cache slots are filled from the layer's K heads (slot s ← head ⌊s·K / K*⌋; query head n then
reads slot ⌊n·K*/H⌋, i.e. head ⌊n·K/H⌋, as grouped-query attention wants). Zero padding stays
zero under training (its gradient is zero). The KV cache and pages are ``[.., K*, E*]`` for
every layer: up to (E*/E)·(K*/K) times what the smaller layers need.

Import pads a checkpoint's heads (:mod:`jaxrl_llm.interop.state_dict_gemma4`) and export strips
the padding; :func:`jaxrl_llm.models.params.param_shapes_and_axes` stores them padded.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def head_dim_slots(e: int, e_store: int) -> np.ndarray:
    """``[E]`` int: the slot of each of a head's E dims in a head of E* = ``e_store`` slots
    (each RoPE half padded at its end)."""
    if e % 2 or e_store % 2 or e > e_store:
        raise ValueError(f"head dims must be even with E={e} <= E*={e_store}")
    half = np.arange(e // 2)
    return np.concatenate([half, e_store // 2 + half])


def pad_heads(w: np.ndarray, heads_axis: int | None, dim_axis: int, n_store: int, e_store: int):
    """``w`` with its heads axis (None: no heads axis) padded with zero heads to ``n_store``
    and its head-dim axis spread into ``e_store`` slots (:func:`head_dim_slots`)."""
    w = np.asarray(w)
    shape = list(w.shape)
    slots = head_dim_slots(shape[dim_axis], e_store)
    shape[dim_axis] = e_store
    if heads_axis is not None:
        shape[heads_axis] = n_store
    out = np.zeros(shape, w.dtype)
    index: list[Any] = [slice(None)] * w.ndim
    index[dim_axis] = slots
    if heads_axis is not None:
        index[heads_axis] = slice(0, w.shape[heads_axis])
    out[tuple(index)] = w
    return out


def unpad_heads(w: np.ndarray, heads_axis: int | None, dim_axis: int, n: int, e: int):
    """Inverse of :func:`pad_heads`: the first ``n`` heads and the ``e`` dims of each."""
    w = np.asarray(w)
    w = np.take(w, head_dim_slots(e, w.shape[dim_axis]), axis=dim_axis)
    if heads_axis is not None:
        w = np.take(w, np.arange(n), axis=heads_axis)
    return w


def kv_slot_heads(k: int, k_store: int) -> np.ndarray:
    """``[K*]`` int: the KV head of a layer with ``k`` heads that fills each of the
    ``k_store`` cache slots (``⌊s·k / K*⌋``)."""
    if k_store % k:
        raise ValueError(f"KV heads {k} must divide the stored {k_store}")
    return np.arange(k_store) * k // k_store
