"""The host side of the paged KV cache: which pages each row holds.

The pool itself, its writes and gathers, paged attention and the paged trunk are device code in
:mod:`jaxrl_llm.models.paged_store` (vLLM's layout, Kwon et al. 2023,
https://arxiv.org/abs/2309.06180). Here: :class:`PageAllocator` (the free list and reference
counts) and :class:`PageTable` (each live row's page list). Rows of one group share the pages
of their prompt; only the partially filled last prompt page, the first one a completion writes
to, is copied per row (copy-on-write, vLLM §4.4). Page 0 (:data:`NULL_PAGE`) is never
allocated.
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import NULL_PAGE

__all__ = ["NULL_PAGE", "PageAllocator", "PageTable", "pages_for"]


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
