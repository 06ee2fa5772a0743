"""A paged KV cache: fixed-size pages, a per-row page table, a free list, paged attention.

The layout of vLLM's PagedAttention (Kwon et al. 2023, "Efficient Memory Management for Large
Language Model Serving with PagedAttention", https://arxiv.org/abs/2309.06180): keys and values
live in a pool of ``num_pages`` pages of ``page_size`` token slots; row r's slot s is slot
``s % page_size`` of page ``table[r, s // page_size]``. A row holds ⌈length / page_size⌉ pages,
so memory follows its length, and attention gathers only the pages in the row's table (up to
a bucketed number of pages), never ``max_len`` slots.

Rows of one group share the pages of their prompt; only the partially filled last prompt
page, the first one a completion writes to, is copied per row (copy-on-write, vLLM §4.4).
Page 0 is the null page: never allocated, it absorbs the writes of idle rows.

Slot s of a row holds the token at RoPE position s (rows are stored unpadded), so a query at
position p sees the keys of slots ≤ p. The layers are the model's own
(``models/transformer.py``: ``_embed``, ``_project_qkv`` before attention, ``_attend`` with
the layer's window and soft cap, ``_output_and_mlp`` after, ``_norm``; the layer index is
passed for Gemma's per-layer types); only the gather of keys/values from pages is new here.

Shapes: R rows, T new tokens, L layers, P pages, Z page size, N table width (pages per row),
K key/value heads, E head dim, D model width.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import AttentionMask, ModelConfig
from jaxrl_llm.models.transformer import (
    _attend,
    _embed,
    _norm,
    _output_and_mlp,
    _project_qkv,
    rope_inv_freq,
)

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
    shape = (config.num_layers, num_pages, page_size, config.num_kv_heads, config.head_dim)
    return PagedKVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


def pages_for(num_tokens: int, page_size: int) -> int:
    """⌈num_tokens / page_size⌉, the pages a row of ``num_tokens`` slots holds."""
    return -(-int(num_tokens) // int(page_size))


class PageAllocator:
    """Host-side free list and reference counts of the pool's pages.

    A page handed out by :meth:`alloc` has count 1; :meth:`share` adds a holder (the G rows of
    a group holding their prompt pages); :meth:`release` drops one and returns the page to the
    free list at 0. Page 0 (the null page) is never handed out.
    """

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ConfigError(f"a pool needs >= 2 pages (page 0 is the null page), got {num_pages}")
        self.num_pages = int(num_pages)
        self.refcount = np.zeros(num_pages, np.int64)
        self._free = list(range(num_pages - 1, 0, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        """Pages on the free list."""
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        """Take ``n`` pages off the free list (count 1 each); ConfigError when too few."""
        if n > len(self._free):
            raise ConfigError(f"page pool exhausted: {n} pages asked, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        self.refcount[pages] = 1
        return pages

    def share(self, pages: list[int], holders: int = 1) -> None:
        """Add ``holders`` holders to each (allocated) page."""
        for p in pages:
            if self.refcount[p] < 1:
                raise ConfigError(f"page {p} is not allocated; cannot share it")
            self.refcount[p] += holders

    def release(self, pages: list[int]) -> None:
        """Drop one holder of each page; a page nobody holds returns to the free list."""
        for p in pages:
            if p == NULL_PAGE or self.refcount[p] < 1:
                raise ConfigError(f"page {p} released but not held")
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self._free.append(p)


class PageTable:
    """Host-side page lists of live rows over a :class:`PageAllocator` (the engine's book).

    A group's G rows share the full pages of their prompt (read-only, count G); each row owns
    its completion pages and its own copy of the partially filled last prompt page (count 1),
    the only pages it ever writes.
    """

    def __init__(self, num_pages: int, page_size: int):
        self.alloc = PageAllocator(num_pages)
        self.page_size = int(page_size)
        self.pages: dict[int, list[int]] = {}  # row -> page ids in slot order
        self.num_shared: dict[int, int] = {}  # row -> leading pages shared with its group

    def add_group(self, rows: list[int], prompt_len: int):
        """Pages for the prompt of a group of rows.

        Returns:
          (prompt pages to write the prefilled prompt into, copy-on-write pairs
          ``[(src, dst), ...]``: each later row's copy of the partial last prompt page).
        """
        z = self.page_size
        n_partial = 1 if prompt_len % z else 0
        need = pages_for(prompt_len, z) + (len(rows) - 1) * n_partial
        if need > self.alloc.num_free:  # all or nothing: no half-admitted group
            raise ConfigError(
                f"page pool exhausted: {need} pages asked, {self.alloc.num_free} free"
            )
        pages = self.alloc.alloc(pages_for(prompt_len, z))
        full, partial = pages[: prompt_len // z], pages[prompt_len // z :]
        self.alloc.share(full, len(rows) - 1)
        cow = []
        for i, row in enumerate(rows):
            own = partial if i == 0 else self.alloc.alloc(len(partial))
            cow += [(s, d) for s, d in zip(partial, own) if s != d]
            self.pages[row] = full + own
            self.num_shared[row] = len(full)
        return pages, cow

    def grow(self, row: int, num_tokens: int) -> None:
        """Give ``row`` enough pages for ``num_tokens`` slots."""
        need = pages_for(num_tokens, self.page_size) - len(self.pages[row])
        if need > 0:
            self.pages[row] += self.alloc.alloc(need)

    def free(self, row: int) -> None:
        """Release a finished row's pages (shared ones return when the last holder leaves)."""
        self.alloc.release(self.pages.pop(row))
        del self.num_shared[row]

    def owned(self, row: int) -> list[int]:
        """The pages ``row`` writes (not shared with its group)."""
        return self.pages[row][self.num_shared[row] :]

    def table(self, rows: list[int | None], width: int) -> np.ndarray:
        """``[len(rows), width]`` int32 page table; None rows and padding are null pages."""
        out = np.full((len(rows), width), NULL_PAGE, np.int32)
        for i, row in enumerate(rows):
            if row is not None:
                ids = self.pages[row][:width]
                out[i, : len(ids)] = ids
        return out


# ----- paged attention and the paged forward --------------------------------------------------


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
) -> jax.Array:
    """Attention of T new queries per row over the keys in the row's pages.

    Query t of row r sits in slot ``start[r] + t`` and sees slots ≤ its own (keys of the new
    tokens must already be written). With T > 1 every row must have the same ``start`` (the
    continuation of one sequence); the decode step (T = 1) allows ragged starts.

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
    return _attend(config, q_rtne, k, v, mask, layer, one_query=True)


def paged_trunk(
    params,
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
    chex.assert_rank([tokens, table, start], [2, 2, 1])
    c = config
    r, t = tokens.shape
    z = cache.page_size
    inv_freq = rope_inv_freq(c)
    pos = start[:, None].astype(jnp.int32) + jnp.arange(t, dtype=jnp.int32)[None, :]
    col = pos // z
    inside = col < table.shape[1]  # slots past the table (padding tokens) go to the null page
    page = jnp.where(inside, jnp.take_along_axis(table, jnp.where(inside, col, 0), axis=1), 0)
    off = pos % z
    x = _embed(c, params, tokens)

    def body(carry, xs):
        x, k_all, v_all = carry
        lp, layer = xs
        q, k, v = _project_qkv(c, x, lp, pos, inv_freq, layer)
        k_all = k_all.at[layer, page, off].set(k.astype(k_all.dtype))
        v_all = v_all.at[layer, page, off].set(v.astype(v_all.dtype))
        attn = paged_attention(q, k_all, v_all, table, start, config=c, layer=layer)
        return (_output_and_mlp(c, x, attn, lp), k_all, v_all), None

    layers = jnp.arange(c.num_layers, dtype=jnp.int32)
    (x, k_new, v_new), _ = jax.lax.scan(body, (x, cache.k, cache.v), (params["layers"], layers))
    x = _norm(c, x, params["final_norm"])
    return x, PagedKVCache(k=k_new, v=v_new)


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
