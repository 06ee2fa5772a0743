"""A paged KV store: a pool of fixed-size pages, a per-row page table, paged attention, and the
paged trunk (the device side of the paged engine).

The layout of vLLM's PagedAttention (Kwon et al. 2023, "Efficient Memory Management for Large
Language Model Serving with PagedAttention", https://arxiv.org/abs/2309.06180): keys and values
live in a pool of ``num_pages`` pages of ``page_size`` token slots; row r's slot s is slot
``s % page_size`` of page ``table[r, s // page_size]``. A row holds ⌈length / page_size⌉ pages,
so memory follows its length, and attention gathers only the pages in the row's table (up to
a bucketed number of pages), never ``max_len`` slots. Page 0 is the null page
(:data:`NULL_PAGE`): never allocated, it absorbs the writes of idle rows and of slots past a
row's table.

Slot s of a row holds the token at RoPE position s (rows are stored unpadded), so a query at
position p sees the keys of slots ≤ p. :func:`paged_trunk` runs the model's one stack
(:func:`jaxrl_llm.models.layer_stack.stack`) over the :class:`Pages` store; only where keys
and values are written and read is new here. Which pages a row holds (the allocator, the
page tables, copy-on-write of a group's prompt pages) is the host's business:
:mod:`jaxrl_llm.sampling.paged`.

Shapes: R rows, T new tokens, L layers, P pages, Z page size, N table width (pages per row),
K key/value heads, E head dim, D model width.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models.attention_mask import AttentionMask
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.gated_deltanet import RecurrentState
from jaxrl_llm.models.layer import KVStore, Params, apply_norm, attend
from jaxrl_llm.models.layer_stack import LayerStores, NewTokens, stack

#: The null page: never allocated; idle rows and slots past a row's table write there.
NULL_PAGE = 0


class PagedKVCache(NamedTuple):
    """The page pool of every layer (a pytree).

    Attributes:
      k, v: ``[L, P, Z, K, E]`` keys (after RoPE) and values; page 0 is the null page.
    """

    k: jax.Array
    v: jax.Array

    @property
    def num_pages(self) -> int:
        """P, pages in the pool (including the null page)."""
        return self.k.shape[1]

    @property
    def page_size(self) -> int:
        """Z, token slots per page."""
        return self.k.shape[2]


def init_paged_cache(config: ModelConfig, num_pages: int, page_size: int, dtype=None):
    """An empty pool of ``num_pages`` pages (page 0 reserved) of ``page_size`` slots."""
    if num_pages < 2 or page_size < 1:
        raise ConfigError(f"need num_pages >= 2 and page_size >= 1, got {num_pages}, {page_size}")
    dtype = config.compute_jnp_dtype if dtype is None else dtype
    # a hybrid stack's pages hold its attention layers' keys only, a KV-sharing stack's those
    # of the layers that compute keys
    n = config.num_kv_layers
    shape = (n, num_pages, page_size, config.store_kv_heads, config.store_head_dim)
    return PagedKVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


def gather_pages(pool: jax.Array, table_rn: jax.Array, layer: jax.Array | None = None):
    """Keys (or values) of each row's pages, in slot order: ``[R, N·Z, K, E]``.

    Args:
      pool: ``[P, Z, K, E]`` one layer's pool, or ``[L, P, Z, K, E]`` with ``layer``.
      table_rn: ``[R, N]`` int32 page ids (pad with the null page).
      layer: ``[]`` int32 layer index into a whole pool: one gather of (layer, page) reads
        only the rows' pages (slicing the layer first could copy its whole pool).
    """
    r, n = table_rn.shape
    z, k, e = pool.shape[-3:]
    pages = pool[table_rn] if layer is None else pool[layer, table_rn]
    return pages.reshape(r, n * z, k, e)


def paged_attention(
    q_rtne: jax.Array,
    k_pool: jax.Array,
    v_pool: jax.Array,
    table: jax.Array,
    start: jax.Array,
    *,
    config: ModelConfig,
    layer: jax.Array | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Attention of T new queries per row over the keys in the row's pages (with the layer's
    attention-sink logits ``sinks`` ``[H]``, gpt-oss; None: none).

    Query t of row r sits in slot ``start[r] + t`` and sees slots ≤ its own (keys of the new
    tokens must already be written). With T > 1 every row must have the same ``start`` (the
    continuation of one sequence); the decode step (T = 1) allows ragged starts, and runs
    :func:`jaxrl_llm.models.attention.one_query_attention` over the gathered pages.

    Args:
      q_rtne: ``[R, T, H, E]`` queries (RoPE applied).
      k_pool, v_pool: ``[P, Z, K, E]`` one layer's pool (or ``[L, P, Z, K, E]`` with
        ``layer``, its traced index).
      table: ``[R, N]`` int32 page table (the first N pages of each row).
      start: ``[R]`` int32 slot of each row's first new token.
      config: the model config (attention implementation, sliding window).

    Returns:
      ``[R, T, H, E]``.
    """
    chex.assert_rank([q_rtne, k_pool, table, start], [4, 4 if layer is None else 5, 2, 1])
    r, t = q_rtne.shape[:2]
    k = gather_pages(k_pool, table, layer).astype(q_rtne.dtype)
    v = gather_pages(v_pool, table, layer).astype(q_rtne.dtype)
    slots = jnp.arange(k.shape[1], dtype=jnp.int32)
    last = start + t - 1  # [R] slot of each row's last query
    window = config.uses_window  # a window (or Gemma's per-layer windows) needs positions
    q_pos = (start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]).astype(jnp.int32)
    mask = AttentionMask(
        q_index=None if t == 1 else (start[0] + jnp.arange(t, dtype=jnp.int32)),
        k_valid=slots[None, :] <= last[:, None],
        q_positions=q_pos if window else None,
        k_positions=jnp.broadcast_to(slots, (r, slots.shape[0])) if window else None,
    )
    return attend(config, q_rtne, k, v, mask, layer, one_query=True, sinks=sinks)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["k", "v", "table", "start", "page", "offset"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class Pages(KVStore):
    """The page pool as a layer's store, for one call's new tokens (a pytree).

    Build it with :func:`pages_store`. Token t of row r is written to slot ``offset[r, t]`` of
    page ``page[r, t]``; queries read the rows' pages through :func:`paged_attention`.

    Attributes:
      k, v: ``[L, P, Z, K, E]`` the pool (:class:`PagedKVCache`).
      table: ``[R, N]`` int32 page table; start: ``[R]`` int32 slot of each row's first new
        token; page, offset: ``[R, T]`` int32 where each new token's keys/values go.
    """

    k: jax.Array
    v: jax.Array
    table: jax.Array
    start: jax.Array
    page: jax.Array
    offset: jax.Array

    def attend(self, config: ModelConfig, q_btne, k_btke, v_btke, layer, sinks=None):
        """Scatter this layer's new keys/values into their pages, then
        :func:`paged_attention`; returns (``[R, T, H, E]``, the store with the written pool)."""
        k_all = self.k.at[layer, self.page, self.offset].set(k_btke.astype(self.k.dtype))
        v_all = self.v.at[layer, self.page, self.offset].set(v_btke.astype(self.v.dtype))
        out = paged_attention(
            q_btne, k_all, v_all, self.table, self.start, config=config, layer=layer, sinks=sinks
        )
        return out, dataclasses.replace(self, k=k_all, v=v_all)


def pages_store(cache: PagedKVCache, table: jax.Array, start: jax.Array, num_tokens: int) -> Pages:
    """The :class:`Pages` store of ``num_tokens`` new tokens per row from slot ``start[r]``:
    token t of row r goes to page ``table[r, (start[r] + t) // Z]`` (the null page past the
    table's N pages), slot ``(start[r] + t) % Z``.

    Args:
      cache: the pool. table: ``[R, N]`` int32 page ids. start: ``[R]`` int32.
      num_tokens: static T.
    """
    chex.assert_rank([table, start], [2, 1])
    z = cache.page_size
    pos = start[:, None].astype(jnp.int32) + jnp.arange(num_tokens, dtype=jnp.int32)[None, :]
    col = pos // z
    inside = col < table.shape[1]  # slots past the table (padding tokens) go to the null page
    page = jnp.where(inside, jnp.take_along_axis(table, jnp.where(inside, col, 0), axis=1), 0)
    return Pages(k=cache.k, v=cache.v, table=table, start=start, page=page, offset=pos % z)


def paged_trunk(
    params: Params,
    tokens: jax.Array,
    cache: PagedKVCache,
    table: jax.Array,
    start: jax.Array,
    *,
    config: ModelConfig,
) -> tuple[jax.Array, PagedKVCache]:
    """Embeddings → L layers over the paged cache → final norm; writes the new keys/values.

    Token t of row r has RoPE position and slot ``start[r] + t``; its keys/values go to page
    ``table[r, slot // Z]``. Rows that should not write (idle slots) pass a table row of
    null pages. Jittable; the pool rides in the layer scan's carry so pages update in place.

    Args:
      params: model parameters.
      tokens: ``[R, T]`` int32 new tokens (T > 1 needs one shared ``start``).
      cache: the :class:`PagedKVCache`.
      table: ``[R, N]`` int32 page ids, enough pages for slots < start + T.
      start: ``[R]`` int32 first slot of the new tokens.
      config: the model config.

    Returns:
      (hidden ``[R, T, D]`` final-normed, the updated cache).
    """
    hidden, cache, _ = paged_trunk_with_routing(params, tokens, cache, table, start, config=config)
    return hidden, cache


def paged_trunk_with_routing(
    params: Params,
    tokens: jax.Array,
    cache: PagedKVCache,
    table: jax.Array,
    start: jax.Array,
    *,
    config: ModelConfig,
) -> tuple[jax.Array, PagedKVCache, jax.Array | None]:
    """:func:`paged_trunk` that also returns the experts a mixture of experts routed each new
    token to, ``[R, T, L, k]`` int32 (None for a dense model): what the paged engine records
    for routing replay (R3, Ma et al. 2025, https://arxiv.org/abs/2510.11370)."""
    if config.is_hybrid:
        raise ValueError(
            "a linear-attention (hybrid) stack such as Qwen3.5 keeps a recurrent state per "
            "row: use paged_hybrid_trunk"
        )
    hidden, cache, _, routing = _paged_trunk(
        params, tokens, cache, table, start, config, None, None
    )
    return hidden, cache, routing


def paged_hybrid_trunk(
    params: Params,
    tokens: jax.Array,
    cache: PagedKVCache,
    table: jax.Array,
    start: jax.Array,
    recurrent: tuple[jax.Array, jax.Array],
    valid: jax.Array,
    *,
    config: ModelConfig,
) -> tuple[jax.Array, PagedKVCache, tuple[jax.Array, jax.Array], jax.Array | None]:
    """:func:`paged_trunk` of a hybrid stack (``config.is_hybrid``, Qwen3.5): the attention
    layers over the pages, the Gated DeltaNet layers over the R rows' recurrent states
    (:class:`~jaxrl_llm.models.gated_deltanet.RecurrentState`).

    Args:
      params, tokens, cache, table, start, config: as :func:`paged_trunk`.
      recurrent: (conv ``[L', R, W−1, C]``, state ``[L', R, H_v, d_k, d_v]``) of the R rows.
      valid: ``[R, T]`` bool, real tokens: the others (idle rows, the padding of a bucketed
        extension) leave a row's recurrent state unchanged.

    Returns:
      (hidden ``[R, T, D]``, the updated pool, the rows' updated (conv, state), and for a
      mixture of experts (Qwen3.5-MoE) the experts each new token was routed to,
      ``[R, T, L, k]`` int32 (else None): what the paged engine records for routing replay).
    """
    if not config.is_hybrid:
        raise ValueError("paged_hybrid_trunk is for hybrid (linear-attention) stacks")
    hidden, cache, rec, experts = _paged_trunk(
        params, tokens, cache, table, start, config, recurrent, valid
    )
    assert rec is not None
    return hidden, cache, rec, experts


def _paged_trunk(params, tokens, cache, table, start, config, recurrent, valid):
    """:func:`paged_trunk_with_routing` / :func:`paged_hybrid_trunk` -> (hidden, pool,
    (conv, state) or None, routing or None): :func:`~jaxrl_llm.models.layer_stack.stack` over
    the :class:`Pages` (and the rows' recurrent states), carried."""
    chex.assert_rank([tokens, table, start], [2, 2, 1])
    c = config
    pages = pages_store(cache, table, start, tokens.shape[1])
    positions = start[:, None].astype(jnp.int32) + jnp.arange(tokens.shape[1], dtype=jnp.int32)
    rec = None
    if recurrent is not None:
        rec = RecurrentState(conv=recurrent[0], state=recurrent[1], valid=valid)
    stores = LayerStores(pages, rec, experts_only=True)
    (x,), held, experts = stack(c, params, [NewTokens(tokens, positions)], stores)
    x = apply_norm(c, x, params["final_norm"])
    routing = None if experts is None else jnp.moveaxis(experts, 0, 2)
    pages, rec = LayerStores.finish(held)
    assert isinstance(pages, Pages)
    conv_state = None if rec is None else (rec.conv, rec.state)
    return x, PagedKVCache(k=pages.k, v=pages.v), conv_state, routing


def write_prompt_pages(
    cache: PagedKVCache,
    dense_k: jax.Array,
    dense_v: jax.Array,
    prompt_lengths: jax.Array,
    pages: jax.Array,
) -> PagedKVCache:
    """Copy left-padded prefilled prompts from a dense cache into their pages (jittable).

    Row a's real tokens sit in the last ``prompt_lengths[a]`` of the dense cache's P slots
    (left padding); slot j of its pages receives dense slot ``P − len_a + j``.

    Args:
      cache: the pool.
      dense_k, dense_v: ``[L, A, P, K, E]`` the prefilled dense cache.
      prompt_lengths: ``[A]`` int32 real prompt tokens per row.
      pages: ``[A, M]`` int32 page ids for slots < M·Z (null page where unused).

    Returns:
      the updated pool.
    """
    chex.assert_rank([dense_k, prompt_lengths, pages], [5, 1, 2])
    z = cache.page_size
    p = dense_k.shape[2]
    a, m = pages.shape
    src = p - prompt_lengths[:, None] + jnp.arange(m * z, dtype=jnp.int32)[None, :]
    src = jnp.clip(src, 0, p - 1)  # [A, M·Z]; slots past the prompt copy junk, later overwritten

    def to_pages(d):  # [L, A, P, K, E] -> [L, A, M, Z, K, E]
        g = jnp.take_along_axis(d, src[None, :, :, None, None], axis=2)
        return g.reshape(d.shape[0], a, m, z, *d.shape[3:])

    k = cache.k.at[:, pages].set(to_pages(dense_k).astype(cache.k.dtype))
    v = cache.v.at[:, pages].set(to_pages(dense_v).astype(cache.v.dtype))
    return PagedKVCache(k=k, v=v)


def copy_pages(cache: PagedKVCache, src: jax.Array, dst: jax.Array) -> PagedKVCache:
    """Copy-on-write: page ``dst[i]`` becomes a copy of page ``src[i]`` in every layer."""
    chex.assert_rank([src, dst], 1)
    k = cache.k.at[:, dst].set(cache.k[:, src])
    return PagedKVCache(k=k, v=cache.v.at[:, dst].set(cache.v[:, src]))
