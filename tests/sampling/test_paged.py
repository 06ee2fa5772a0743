"""Tests of jaxrl_llm/sampling/paged.py: the page allocator never hands one page to two live
rows. (The pool, paged attention and the paged trunk are tests/models/test_paged_store.py.)"""

import numpy as np
import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.sampling.paged import NULL_PAGE, PageAllocator, PageTable


def test_page_table_never_hands_one_page_to_two_live_rows():
    """Random sequences of group admissions, growth and frees (plain numpy property loop)."""
    rng = np.random.default_rng(0)
    for _ in range(25):
        n_pages, z = int(rng.integers(2, 48)), int(rng.integers(1, 6))
        book = PageTable(n_pages, z)
        groups: dict[int, list[int]] = {}  # row -> its group's rows
        next_row = 0
        for _ in range(150):
            op = rng.random()
            live = list(book.pages)
            if live and op < 0.35:
                row = int(rng.choice(live))
                book.free(row)
            elif live and op < 0.6:
                row = int(rng.choice(live))
                try:
                    book.grow(row, len(book.pages[row]) * z + int(rng.integers(1, 3 * z)))
                except ConfigError:
                    pass
            else:
                g, plen = int(rng.integers(1, 4)), int(rng.integers(1, 4 * z))
                rows = list(range(next_row, next_row + g))
                try:
                    book.add_group(rows, plen)
                except ConfigError:
                    continue
                next_row += g
                for r in rows:
                    groups[r] = rows
            owned = [p for r in book.pages for p in book.owned(r)]
            held = [p for r in book.pages for p in book.pages[r]]
            # a page a row writes belongs to that row alone, with count 1
            assert len(owned) == len(set(owned)) and set(owned).isdisjoint(
                p for r in book.pages for p in book.pages[r][: book.num_shared[r]]
            )
            assert all(book.alloc.refcount[p] == 1 for p in owned)
            # shared pages are shared only inside a group
            for r in book.pages:
                for p in book.pages[r][: book.num_shared[r]]:
                    holders = {q for q in book.pages if p in book.pages[q]}
                    assert holders <= set(groups[r])
            # free list and live pages are disjoint, counts match holders, page 0 never out
            free = set(book.alloc._free)
            assert not free & set(held) and NULL_PAGE not in held and NULL_PAGE not in free
            counts = np.bincount(np.asarray(held, np.int64), minlength=n_pages)
            np.testing.assert_array_equal(counts, book.alloc.refcount)
            assert book.alloc.num_free + len(set(held)) == n_pages - 1
    with pytest.raises(ConfigError):
        PageAllocator(4).release([1])
