"""The attention stores of the dense trunks (:class:`~jaxrl_llm.models.layer.KVStore`s).

Each is a frozen dataclass registered as a pytree: its arrays are leaves, a size it needs at
trace time (the group size) is static. Every method is a pure function of the store and the
new keys/values; an updated store comes back as a new value.

- :class:`NoCache`: the training forward; the new tokens are all there is (causal
  self-attention, padding, packing, sliding windows by RoPE position).
- :class:`DenseCache`: the preallocated cache of prefill and the static engine
  (:class:`~jaxrl_llm.models.KVCache`): this layer's new keys/values are written at one slot
  index for every row, the queries read every slot the mask allows. Stacked ``[L, ...]``
  (read at a traced layer index under ``lax.scan``) or layered (a tuple of per-layer
  buffers, the layer loop unrolled: what the samplers use, read in place).
- :class:`GroupPrompt` then :class:`SharedPrompt`: a group's prompt computed once per group.
  The prompt rows (one per group) run as self-attention and keep their keys/values; the G
  completions of each group attend to those keys repeated G times and to their own.

The paged engine's store is :class:`jaxrl_llm.models.paged_store.Pages`.

:class:`KVShared` wraps any of them for a stack whose last layers reuse an earlier layer's
keys/values (Gemma 4's KV sharing): every store then writes and reads its own layer's keys as
before, a KV-shared layer's being copies of its source layer's.

Shapes: B rows, T new tokens, S cache slots, L layers, H query heads, K key/value heads,
E head dim.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxrl_llm.models.attention_mask import AttentionMask
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.layer import KVStore, attend
from jaxrl_llm.models.positions import layer_kv_sharing


@functools.partial(jax.tree_util.register_dataclass, data_fields=["mask"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class NoCache(KVStore):
    """No cache: the new tokens attend to each other only (the training forward).

    Attributes:
      mask: the :class:`AttentionMask` of the new tokens' causal self-attention
        (:func:`jaxrl_llm.models.causal_self_mask`).
    """

    mask: AttentionMask

    def attend(self, config: ModelConfig, q_btne, k_btke, v_btke, layer, sinks=None):
        """Causal self-attention of the new tokens; the store is unchanged."""
        return attend(config, q_btne, k_btke, v_btke, self.mask, layer, sinks=sinks), self


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["k", "v", "index", "mask"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class DenseCache(KVStore):
    """A dense KV cache: every row's slots ``[S]`` of every layer, written at one slot index.

    Attributes:
      k, v: ``[L, B, S, K, E]`` keys (after RoPE) and values of every layer, or (layered)
        tuples of L ``[1, B, S, K, E]`` buffers, one per layer.
      index: ``[]`` int32 slot of the first new token (the same for every row).
      mask: the :class:`AttentionMask` of the new queries (slots ``index + t``) over the S
        slots, with this call's tokens already marked valid.
    """

    k: jax.Array | tuple[jax.Array, ...]
    v: jax.Array | tuple[jax.Array, ...]
    index: jax.Array
    mask: AttentionMask

    def attend(self, config: ModelConfig, q_btne, k_btke, v_btke, layer, sinks=None):
        """Write the new keys/values in place at ``(layer, :, index)`` and attend over the
        layer's S slots; returns (``[B, T, H, E]``, the store with the written cache)."""
        if isinstance(self.k, tuple) or isinstance(self.v, tuple):
            return self._attend_layered(config, q_btne, k_btke, v_btke, layer, sinks)
        zero = jnp.zeros((), jnp.int32)
        at = (layer, zero, self.index, zero, zero)
        k_all = jax.lax.dynamic_update_slice(self.k, k_btke.astype(self.k.dtype)[None], at)
        v_all = jax.lax.dynamic_update_slice(self.v, v_btke.astype(self.v.dtype)[None], at)
        dtype = q_btne.dtype
        k_att = jax.lax.dynamic_index_in_dim(k_all, layer, 0, keepdims=False).astype(dtype)
        v_att = jax.lax.dynamic_index_in_dim(v_all, layer, 0, keepdims=False).astype(dtype)
        out = attend(config, q_btne, k_att, v_att, self.mask, layer, sinks=sinks)
        return out, dataclasses.replace(self, k=k_all, v=v_all)

    def _attend_layered(self, config: ModelConfig, q_btne, k_btke, v_btke, layer, sinks):
        """:meth:`attend` over a layered cache (:func:`~jaxrl_llm.models.init_cache` with
        ``layered=True``): layer ``layer`` (a static index: the unrolled layer loop's) owns
        its own ``[1, B, S, K, E]`` buffers, written in place and read whole, so no slice
        of a stacked buffer is copied out for the attention to read."""
        i = static_layer(layer)
        assert isinstance(self.k, tuple) and isinstance(self.v, tuple)
        zero = jnp.zeros((), jnp.int32)
        at = (zero, zero, self.index, zero, zero)
        k_i = jax.lax.dynamic_update_slice(self.k[i], k_btke.astype(self.k[i].dtype)[None], at)
        v_i = jax.lax.dynamic_update_slice(self.v[i], v_btke.astype(self.v[i].dtype)[None], at)
        dtype = q_btne.dtype
        k_att, v_att = k_i[0].astype(dtype), v_i[0].astype(dtype)
        out = attend(config, q_btne, k_att, v_att, self.mask, layer, sinks=sinks)
        k = (*self.k[:i], k_i, *self.k[i + 1 :])
        v = (*self.v[:i], v_i, *self.v[i + 1 :])
        return out, dataclasses.replace(self, k=k, v=v)

    @property
    def layered(self) -> bool:
        """The cache is one ``[1, B, S, K, E]`` buffer per layer (a tuple), not a stack."""
        return isinstance(self.k, tuple)


def static_layer(layer) -> int:
    """The layer index as a Python int: a layered cache's layer loop is unrolled and passes
    concrete indices (:func:`~jaxrl_llm.models.layer_scan.scan_layers` with ``unroll``).

    Raises:
      TypeError: ``layer`` is traced (a ``lax.scan`` over the layers, or KV sharing's
        source-layer table), which a layered cache cannot index.
    """
    try:
        return int(layer)
    except jax.errors.ConcretizationTypeError:
        raise TypeError(
            "a layered KV cache needs a static layer index: run the layers unrolled "
            "(scan_layers(unroll=True)); KV-shared and hybrid stacks keep the stacked cache"
        ) from None


@functools.partial(jax.tree_util.register_dataclass, data_fields=["mask", "k", "v"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class GroupPrompt(KVStore):
    """A group's prompt, one row per group: causal self-attention that keeps this layer's
    keys/values for the group's completions (:class:`SharedPrompt`).

    Attributes:
      mask: the :class:`AttentionMask` of the prompt rows' causal self-attention.
      k, v: ``[B/G, T_p, K, E]`` the last attended layer's prompt keys/values (None before).
    """

    mask: AttentionMask
    k: jax.Array | None = None
    v: jax.Array | None = None

    def attend(self, config: ModelConfig, q_btne, k_btke, v_btke, layer, sinks=None):
        """Self-attention of the prompt rows; the store comes back holding their keys/values."""
        out = attend(config, q_btne, k_btke, v_btke, self.mask, layer, sinks=sinks)
        return out, dataclasses.replace(self, k=k_btke, v=v_btke)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["k", "v", "mask"],
    meta_fields=["group_size"],
)
@dataclasses.dataclass(frozen=True)
class SharedPrompt(KVStore):
    """The completions of groups of G rows that share a prompt computed once per group.

    Row ``g·G + i`` reads its group's prompt keys/values (``k[g]``, repeated G times; under
    autodiff the repeat's transpose sums the G completions' gradients into the prompt) and
    then its own new tokens'.

    Attributes:
      k, v: ``[B/G, T_p, K, E]`` this layer's prompt keys/values (:attr:`GroupPrompt.k`).
      mask: the :class:`AttentionMask` of the completion queries (slots ``T_p + t``) over the
        ``T_p + T`` keys of their row.
      group_size: static G.
    """

    k: jax.Array
    v: jax.Array
    mask: AttentionMask
    group_size: int

    def attend(self, config: ModelConfig, q_btne, k_btke, v_btke, layer, sinks=None):
        """Attention of the completions over [prompt; completion] keys; store unchanged."""
        g = self.group_size
        k_all = jnp.concatenate([jnp.repeat(self.k, g, axis=0), k_btke], axis=1)
        v_all = jnp.concatenate([jnp.repeat(self.v, g, axis=0), v_btke], axis=1)
        return attend(config, q_btne, k_all, v_all, self.mask, layer, sinks=sinks), self


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["inner", "k", "v"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class KVShared(KVStore):
    """KV sharing across layers (``config.attn.kv_shared_layers``; Gemma 4's E2B / E4B, transformers'
    ``Gemma4TextAttention`` with ``is_kv_shared_layer``) around another store.

    It holds the new tokens' keys/values of the last layer of each type. A layer that is not
    KV-shared passes its own to the inner store and becomes its type's holder; a KV-shared
    layer passes its type's held keys/values instead of its own (its k/v weights are zero
    and unused) to the inner store as its source layer (the layer index a store writes at,
    reads from and takes the window of: the same type, the same window). A cache writes the
    source's new keys again (the same values) and reads the source's slots, so it holds
    slots for the ``config.num_kv_layers`` layers that compute keys only, and a decode step's
    shared layer attends over the keys its source wrote, as transformers' shared layers read
    the source's cache. Gradients reach the source layer's keys through the held copy.

    Attributes:
      inner: the wrapped :class:`KVStore`.
      k, v: ``[n_types, B, T, K, E]`` the held keys/values of each layer type.
    """

    inner: KVStore
    k: jax.Array
    v: jax.Array

    def attend(self, config: ModelConfig, q_btne, k_btke, v_btke, layer, sinks=None):
        """The inner store's attend with a KV-shared layer's keys/values replaced by its
        type's held ones; returns (``[B, T, H, E]``, the store holding this layer's)."""
        tables = layer_kv_sharing(config)
        assert tables is not None, "KVShared needs config.attn.kv_shared_layers"
        reuse, slot, source = (jnp.asarray(t)[layer] for t in tables)
        k = jnp.where(reuse, self.k[slot], k_btke.astype(self.k.dtype))
        v = jnp.where(reuse, self.v[slot], v_btke.astype(self.v.dtype))
        out, inner = self.inner.attend(config, q_btne, k, v, source, sinks)
        return out, KVShared(inner, self.k.at[slot].set(k), self.v.at[slot].set(v))


def empty_held_kv(config: ModelConfig, rows: int, length: int, dtype):
    """(k, v) zeros ``[n_types, rows, length, K*, E*]``: what :class:`KVShared` holds before
    the first layer, when the config shares keys/values across layers; None otherwise."""
    if not config.attn.kv_shared_layers:
        return None
    n_types = len(set(config.attn.layer_types))
    shape = (n_types, rows, length, config.store_kv_heads, config.store_head_dim)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def share_kv(config: ModelConfig, store: KVStore, rows: int, length: int, dtype) -> KVStore:
    """``store`` wrapped in :class:`KVShared` for ``rows`` × ``length`` new tokens when the
    config shares keys/values across layers; ``store`` itself otherwise."""
    held = empty_held_kv(config, rows, length, dtype)
    return store if held is None else KVShared(store, *held)


def unshare_kv(store: KVStore) -> KVStore:
    """The store :func:`share_kv` wrapped (``store`` itself when it was not)."""
    return store.inner if isinstance(store, KVShared) else store
