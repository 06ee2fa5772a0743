"""The decode cache: keys/values (stacked, or one buffer per layer) and a hybrid stack's
recurrent state, an explicit pytree passed in and returned by the trunks of
:mod:`jaxrl_llm.models.transformer`."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.gated_deltanet import init_recurrent_state

__all__ = ["KVCache", "init_cache", "layered_cache_supported"]


class KVCache(NamedTuple):
    """Explicit key/value cache (and, for a hybrid stack, the LINEAR layers' recurrent state).

    Attributes:
      k, v: ``[L, B, S, K, E]`` keys (after RoPE) and values; in a hybrid stack L counts the
        softmax-attention layers only. Layered (``init_cache(layered=True)``): tuples of L
        ``[1, B, S, K, E]`` buffers, one per layer, which the layer loop (then unrolled)
        writes and reads in place.
      mask: ``[B, S]`` bool, slot holds a real token of that row.
      positions: ``[B, S]`` int32 RoPE position of the token in each slot (for sliding windows).
      index: ``[]`` int32, the next slot to write.
      conv, state: a hybrid stack's (``config.is_hybrid``) Gated DeltaNet conv windows
        ``[L', B, W−1, C]`` and delta-rule states ``[L', B, H_v, d_k, d_v]`` float32
        (:class:`~jaxrl_llm.models.gated_deltanet.RecurrentState`); None otherwise.
    """

    k: jax.Array | tuple[jax.Array, ...]
    v: jax.Array | tuple[jax.Array, ...]
    mask: jax.Array
    positions: jax.Array
    index: jax.Array  # type: ignore[assignment]  # shadows tuple.index; fine at run time
    conv: jax.Array | None = None
    state: jax.Array | None = None

    @property
    def max_len(self) -> int:
        """Number of slots S."""
        return (self.k[0] if isinstance(self.k, tuple) else self.k).shape[2]

    def stacked_kv(self) -> tuple[jax.Array, jax.Array]:
        """Keys and values as ``[L, B, S, K, E]`` arrays, a layered cache's buffers
        concatenated (what the paged engine writes into its pages)."""

        def stack(kv):
            return jnp.concatenate(kv, axis=0) if isinstance(kv, tuple) else kv

        return stack(self.k), stack(self.v)


def layered_cache_supported(config: ModelConfig) -> bool:
    """A layered cache (one buffer per layer, :func:`init_cache` ``layered=True``) runs this
    stack: a uniform stack without KV sharing (a hybrid stack scans its periods, a KV-shared
    layer reads its source layer at a traced index)."""
    return not config.is_hybrid and not config.attn.kv_shared_layers


def init_cache(
    config: ModelConfig, batch_size: int, max_len: int, dtype=None, *, layered: bool = False
) -> KVCache:
    """An empty cache with ``max_len`` slots for ``batch_size`` rows.

    ``layered``: keys/values as one ``[1, B, S, K, E]`` buffer per layer (a tuple; the layer
    loop then runs unrolled and each layer writes and reads its own buffer in place) instead
    of one stacked ``[L, B, S, K, E]`` array, whose per-layer slice XLA:TPU copies out at
    every step before the attention reads it (issue 54: the copy of each layer's K/V slice
    seen in the optimized HLO of the decode loop). Needs :func:`layered_cache_supported`.
    """
    dtype = config.compute_jnp_dtype if dtype is None else dtype
    n = config.num_kv_layers  # not the KV-shared layers (Gemma 4): they read their source's
    shape = (n, batch_size, max_len, config.store_kv_heads, config.store_head_dim)
    conv, state = (
        init_recurrent_state(config, batch_size, dtype) if config.is_hybrid else (None, None)
    )
    k: jax.Array | tuple[jax.Array, ...]
    v: jax.Array | tuple[jax.Array, ...]
    if layered:
        if not layered_cache_supported(config):
            raise ValueError("a layered cache needs a uniform stack without KV sharing")
        one = (1, *shape[1:])
        k = tuple(jnp.zeros(one, dtype) for _ in range(n))
        v = tuple(jnp.zeros(one, dtype) for _ in range(n))
    else:
        k, v = jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)
    return KVCache(
        k=k,
        v=v,
        mask=jnp.zeros((batch_size, max_len), bool),
        positions=jnp.zeros((batch_size, max_len), jnp.int32),
        index=jnp.zeros((), jnp.int32),
        conv=conv,
        state=state,
    )
