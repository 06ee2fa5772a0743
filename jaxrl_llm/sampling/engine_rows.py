"""Host side of the paged engine (:mod:`.engine`): its rows, each replica's bookkeeping and
the host arrays its device programs take.

:class:`Row` is one sequence (its prompt, key and everything generated so far);
:class:`Replica` holds one replica's page table, queues and slots (row ids are the engine's);
:func:`layout_routing` lays recorded experts out as a :class:`~jaxrl_llm.sampling.Rollout`.
The ``*_arrays`` functions build the numpy inputs of the device programs of
:mod:`.slots`, every replica's values stacked replica first (a replica with nothing to do gets
padding that writes only the null page). Nothing here touches a device.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

from jaxrl_llm.models import NULL_PAGE
from jaxrl_llm.sampling.config import bucket_length
from jaxrl_llm.sampling.paged import PageTable, pages_for
from jaxrl_llm.sampling.slots import POW2
from jaxrl_llm.sampling.static_generate import pad_prompts


@dataclasses.dataclass
class Row:
    """Host record of one sequence: the prompt, its key, and everything generated so far.

    ``tokens`` / ``mask`` / ``logprobs`` hold the completion side of the conversation: policy
    tokens (mask 1) and appended tokens (mask 0, log-prob 0), in order.
    """

    prompt: list[int]
    prompt_id: int
    sample_id: int
    budget: int
    keep: bool = False
    tokens: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    steps: int = 0  # policy tokens drawn so far (the key stream's position)
    turn_start: int = 0  # index in ``tokens`` where this turn's policy tokens begin
    cache_len: int = 0
    finished: bool = False
    done: bool = False
    versions: list[int] = dataclasses.field(default_factory=list)  # per token; -1 = appended
    # with record_routing: [len(prompt), L, k] and one [n, L, k] block per run of ``tokens``
    prompt_routing: np.ndarray | None = None
    routing: list[np.ndarray] = dataclasses.field(default_factory=list)

    def token_routing(self) -> np.ndarray | None:
        """``[len(tokens), L, k]`` the recorded experts of ``tokens`` (None: not recorded)."""
        if self.prompt_routing is None:
            return None
        empty = self.prompt_routing[:0]
        return np.concatenate([empty, *self.routing], axis=0)


def layout_routing(
    prompt_routing: list[np.ndarray], token_routing: list[np.ndarray], p: int, m: int
) -> np.ndarray:
    """``[N, P + M, L, k]`` rows' recorded experts (:attr:`Row.prompt_routing`,
    :meth:`Row.token_routing`) in the :class:`~jaxrl_llm.sampling.Rollout` layout: row i's
    prompt left-padded to P, its completion side from column P, cut at M; columns with no
    token hold the experts 0..k−1 (valid ids, masked in the update)."""
    first = prompt_routing[0]
    _, num_layers, k = first.shape
    out = np.broadcast_to(
        np.arange(k, dtype=first.dtype), (len(prompt_routing), p + m, num_layers, k)
    ).copy()
    for i, (pr, done) in enumerate(zip(prompt_routing, token_routing, strict=True)):
        out[i, p - len(pr) : p] = pr
        out[i, p : p + len(done)] = done[:m]
    return out


# (slot, row, index into the logits source, version) of a row started in a slot
Start = tuple[int, int, int, int]


class Replica:
    """Host bookkeeping of one replica of the paged engine: its page table, queues and slots
    (row ids are the engine's; ``rows`` arguments are the engine's :class:`Row` list)."""

    def __init__(self, num_pages: int, page_size: int, num_slots: int):
        self.book = PageTable(num_pages, page_size)
        self.waiting: collections.deque[list[int]] = collections.deque()  # groups of rows
        # rows to continue: (row, the logits [1, V] their next token is drawn from, their
        # version, a hybrid stack's recurrent state of the row [L', 1, ...] or None)
        self.resume: collections.deque[tuple[int, np.ndarray, int, Any]] = collections.deque()
        self.slot_row: list[int | None] = [None] * num_slots
        self.gen: dict[int, int] = {}  # live row -> tokens generated in its turn so far
        self.logit_version = [0] * num_slots  # per slot: the version of its next logits
        self.turn_versions: dict[int, list[int]] = {}  # live row -> its turn's token versions

    def live(self) -> list[tuple[int, int]]:
        """(slot, row) of the rows decoding."""
        return [(i, r) for i, r in enumerate(self.slot_row) if r is not None]

    def free_slots(self) -> list[int]:
        """The slots holding no row, lowest first."""
        return [i for i, r in enumerate(self.slot_row) if r is None]

    def grow_ahead(self, rows: list[Row], chunk_steps: int) -> int:
        """Give each live row the pages of its next chunk; the most pages a live row holds
        (1 when none is live)."""
        held = 1
        for _, r in self.live():
            row = rows[r]
            left = row.budget - self.gen[r]
            self.book.grow(r, row.cache_len + min(chunk_steps, left))
            held = max(held, len(self.book.pages[r]))
        return held

    def reserve(self, rows: list[Row], r: int) -> int:
        """Pages row ``r`` may still need to finish its turn."""
        row = rows[r]
        end = len(row.prompt) + row.turn_start + row.budget
        return pages_for(end, self.book.page_size) - len(self.book.pages.get(r, []))

    def take_resumed(self, free: list[int]) -> tuple[list[Start], list[tuple[np.ndarray, Any]]]:
        """Continued rows into the ``free`` slots (taken off it): their starts and their
        (logits, recurrent state) sources."""
        starts: list[Start] = []
        sources: list[tuple[np.ndarray, Any]] = []
        while self.resume and free:
            r, logits, version, rec = self.resume.popleft()
            starts.append((free.pop(0), r, len(sources), version))
            sources.append((logits, rec))
        return starts, sources

    def admit(self, rows: list[Row], free: list[int], version: int):
        """Admit waiting groups into the ``free`` slots (taken off it) while the pool holds
        their worst case next to the live rows' reserve. Returns the rows' starts, the groups
        admitted (row ids, their prompt pages) and the (source, destination) page copies of
        the groups' partial last prompt pages."""
        z = self.book.page_size
        starts: list[Start] = []
        groups: list[tuple[list[int], list[int]]] = []
        cow: list[tuple[int, int]] = []
        reserved = sum(self.reserve(rows, r) for r in self.slot_row if r is not None)
        while self.waiting and len(self.waiting[0]) <= len(free):
            ids = self.waiting[0]
            plen = len(rows[ids[0]].prompt)
            worst = sum(pages_for(plen + rows[r].budget, z) for r in ids)
            worst -= (len(ids) - 1) * (plen // z)  # full prompt pages are held once
            if self.book.alloc.num_free - reserved < worst:
                break
            pages, pairs = self.book.add_group(ids, plen)
            reserved += worst - pages_for(plen, z) - len(pairs)
            self.waiting.popleft()
            cow += pairs
            for r in ids:
                starts.append((free.pop(0), r, len(groups), version))
            groups.append((ids, pages))
        return starts, groups, cow

    def collect(self, rows: list[Row], out: dict[str, Any], version: int) -> list[tuple[int, int]]:
        """Record this replica's slots after a chunk (``out``: the host copies of its
        ``active``, ``gen``, ``finished``, ``tokens``, ``logprobs`` and ``routing`` (or None),
        slot first) and free the slots whose turn ended; returns their (slot, row) (a kept row
        keeps its pages)."""
        ended: list[tuple[int, int]] = []
        for slot, r in enumerate(self.slot_row):
            if r is None:
                continue
            row = rows[r]
            g = int(out["gen"][slot])
            new = g - self.gen[r]  # drawn in this chunk: the first from the logits it
            if new > 0:  # began with, the others from this chunk's weights
                vs = self.turn_versions[r]
                vs += [self.logit_version[slot]] + [version] * (new - 1)
                self.logit_version[slot] = version
            self.gen[r] = g
            row.cache_len = len(row.prompt) + row.turn_start + g
            if out["active"][slot]:
                continue
            row.tokens += out["tokens"][slot, :g].tolist()
            row.mask += [1] * g
            row.logprobs += out["logprobs"][slot, :g].tolist()
            if out["routing"] is not None:
                row.routing.append(out["routing"][slot, :g])
            row.steps += g
            row.versions += self.turn_versions.pop(r)
            row.finished, row.done = bool(out["finished"][slot]), True
            self.slot_row[slot] = None
            del self.gen[r]
            ended.append((slot, r))
            if not row.keep:
                self.book.free(r)
        return ended


def start_arrays(rows: list[Row], replicas: list[Replica], starts: list[list[Start]], s: int):
    """Mark each replica's started rows live in their slots; the host inputs of
    :func:`~jaxrl_llm.sampling.slots.admit_rows`, ``[R, S]`` each (slots, source index, key
    offset, cache length, budget; unused entries point at slot S, dropped) and ``[R, S, 2]``
    the rows' (prompt id, sample id)."""
    n = len(replicas)
    slots = np.full((n, s), s, np.int32)
    src, off, clen, budget = (np.zeros((n, s), np.int32) for _ in range(4))
    ids = np.zeros((n, s, 2), np.int32)
    for k, started in enumerate(starts):
        rep = replicas[k]
        for i, (slot, r, j, version) in enumerate(started):
            row = rows[r]
            slots[k, i], src[k, i], off[k, i], budget[k, i] = slot, j, row.steps, row.budget
            clen[k, i] = row.cache_len
            ids[k, i] = row.prompt_id, row.sample_id
            rep.slot_row[slot] = r
            rep.gen[r] = 0
            rep.logit_version[slot] = version
            rep.turn_versions[r] = []
    return slots, src, ids, off, clen, budget


def resume_arrays(sources: list[list[tuple[np.ndarray, Any]]], vocab_size: int):
    """Continued rows' logits ``[R, A, V]`` and recurrent states ``[R, L', A, ...]`` (or
    None), stacked per replica and padded to A rows (a power of two)."""
    n = len(sources)
    a = bucket_length(max(map(len, sources)), POW2)
    logits = np.zeros((n, a, vocab_size), np.float32)
    rec = None
    first = next(src[0][1] for src in sources if src)
    if first is not None:
        rec = tuple(np.zeros((n, x.shape[0], a, *x.shape[2:]), x.dtype) for x in first)
    for k, src in enumerate(sources):
        for j, (lg, rr) in enumerate(src):
            logits[k, j] = lg[0]
            if rec is not None:
                rec[0][k, :, j], rec[1][k, :, j] = rr[0][:, 0], rr[1][:, 0]
    return logits, rec


@dataclasses.dataclass
class PrefillArrays:
    """Host inputs of a prefill round, every replica's admitted groups padded to A groups.

    Attributes:
      prompts: per replica, each admitted group's prompt.
      tokens, mask: ``[R, A, P]`` the prompts left-padded to P (a bucket length).
      lens: ``[R, A]`` the prompts' lengths (1 for padding groups).
      pages: ``[R, A, ⌈P / Z⌉]`` each group's prompt pages (the null page past them).
      pairs: ``[R, S, 2]`` (source, destination) page copies (null → null pads the list).
    """

    prompts: list[list[list[int]]]
    tokens: np.ndarray
    mask: np.ndarray
    lens: np.ndarray
    pages: np.ndarray
    pairs: np.ndarray

    @property
    def width(self) -> int:
        """P, the padded prompt length."""
        return int(self.tokens.shape[-1])


def prefill_arrays(
    rows: list[Row],
    groups: list[list[tuple[list[int], list[int]]]],
    cow: list[list[tuple[int, int]]],
    *,
    pad_id: int,
    page_size: int,
    num_slots: int,
) -> PrefillArrays:
    """The :class:`PrefillArrays` of each replica's admitted ``groups`` (row ids, prompt
    pages) and partial-page copies ``cow`` (:meth:`Replica.admit`)."""
    n = len(groups)
    a = bucket_length(max(map(len, groups)), POW2)
    prompts = [[rows[ids[0]].prompt for ids, _ in gs] for gs in groups]
    p = bucket_length(max(len(x) for ps in prompts for x in ps))
    padded = [pad_prompts(ps + [[pad_id]] * (a - len(ps)), length=p) for ps in prompts]
    pages = np.full((n, a, pages_for(p, page_size)), NULL_PAGE, np.int32)
    lens = np.ones((n, a), np.int32)
    pairs = np.zeros((n, num_slots, 2), np.int32)
    for k, gs in enumerate(groups):
        for i, (_, pg) in enumerate(gs):
            pages[k, i, : len(pg)] = pg
            lens[k, i] = len(prompts[k][i])
        if cow[k]:
            pairs[k, : len(cow[k])] = cow[k]
    tokens = np.stack([t for t, _ in padded])
    mask = np.stack([m for _, m in padded])
    return PrefillArrays(prompts, tokens, mask, lens, pages, pairs)


def extend_arrays(
    tokens: list[int], k: int, n: int, *, table: np.ndarray, start: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host inputs of :func:`~jaxrl_llm.sampling.slots.extend_row` for appending ``tokens``
    to one row of replica ``k`` of ``n`` (its page table ``table`` ``[1, W]``, its cache
    length ``start``): the tokens ``[R, 1, T]`` (T a bucket length), the tables ``[R, 1, W]``,
    the starts and last-token indices ``[R, 1]``; the other replicas get a pad token written
    to their null page."""
    padded = np.full((n, 1, bucket_length(len(tokens))), pad_id, np.int32)
    padded[k, 0, : len(tokens)] = tokens
    tables = np.full((n, 1, table.shape[-1]), NULL_PAGE, np.int32)
    tables[k] = table
    starts, last = np.zeros((n, 1), np.int32), np.zeros((n, 1), np.int32)
    starts[k, 0], last[k, 0] = start, len(tokens) - 1
    return padded, tables, starts, last
