"""Continuous batching over the paged KV cache (:mod:`jaxrl_llm.models.paged_store`; page
tables :mod:`jaxrl_llm.sampling.paged`).

A fixed number of decode slots S. The host admits whole groups (a prompt and its G samples)
into free slots: the group's prompt is prefilled once (the static engine's :func:`prefill`),
copied into pages that its G rows share, and the partial last prompt page is copied per row.
The device then runs a jitted ``lax.while_loop`` of up to ``chunk_steps`` decode steps over
all slots (state donated, no host round trip per token); rows that emit a stop token or reach
their budget go idle. Between chunks the host collects finished rows, frees their pages and
refills their slots from the queue: the iteration-level scheduling of Orca (Yu et al. 2022,
https://www.usenix.org/conference/osdi22/presentation/yu) over vLLM's paged cache (Kwon et al.
2023, https://arxiv.org/abs/2309.06180), with refills at chunk boundaries.

A row's token at its step t is drawn with ``fold_in(row_keys(seed, prompt_id, sample), t)``,
the static engine's key for that row and step, from the same logits up to float rounding, so
its tokens do not depend on the slot or the batch it ran in. Pages are added to a row as it
grows (one chunk ahead), so a row holds memory in proportion to its length; attention gathers
the first N pages of each table, N the bucketed largest page count among live rows.

A row submitted with ``keep=True`` keeps its pages after a turn; :meth:`PagedEngine.extend`
appends tokens (an environment's reply) through the paged cache, without prefilling the
conversation again, and decoding resumes; appended tokens have mask 0 and log-prob 0.

Weights can change between chunks (:meth:`PagedEngine.swap`): the partial rollouts of the
asynchronous trainers (AReaL's interruptible generation, Fu et al. 2025,
https://arxiv.org/abs/2505.24298; PipelineRL's in-flight weight updates, Piché et al. 2025,
https://arxiv.org/abs/2509.19128). Rows in flight keep their KV cache (computed by the old
weights, as in PipelineRL) and continue with the new weights; every sampled token records the
version of the weights whose logits it was drawn from (``Row.versions``; -1 for appended
tokens), and its behaviour log-prob is that of those logits.

With ``record_routing`` (a mixture of experts) every token a row runs through the model — its
prompt (from the group's prefill), its sampled tokens, appended tokens — records the experts
it was routed to in every layer (``Row.prompt_routing``, ``Row.routing``), for rollout routing
replay in the update (R3, Ma et al. 2025, https://arxiv.org/abs/2510.11370).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import NULL_PAGE, ModelConfig, init_paged_cache, init_recurrent_state
from jaxrl_llm.sampling.config import SamplingConfig, bucket_length
from jaxrl_llm.sampling.decode import prefill, prefill_with_routing, routing_dtype
from jaxrl_llm.sampling.paged import PageTable, pages_for
from jaxrl_llm.sampling.slots import (
    POW2,
    SlotState,
    admit_rows,
    cast_for_rollout,
    cow_copy,
    decode_chunk,
    extend_row,
    store_prompts,
)
from jaxrl_llm.sampling.static_generate import pad_prompts, stop_token_ids


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


class PagedEngine:
    """Continuous batching of sequences over S slots and a paged KV cache (see module doc).

    Args:
      params, config: the model (cast with ``dtype`` = 'bfloat16' for a bfloat16 rollout).
      sampling: :class:`SamplingConfig`; seed: keys rows as the static engine does.
      num_slots: S rows decoded together; page_size: Z slots per page.
      max_len: longest prompt + conversation a row may reach (sets the table width W).
      gen_len: M, the most tokens one turn generates (width of the slot buffers).
      num_pages: pool size (default: enough for S rows of ``max_len`` + the null page).
      chunk_steps: decode steps per jitted chunk between host refills.
      dtype: None, 'float32' or 'bfloat16'.
      version: the weights' version (recorded per sampled token; :meth:`swap` changes it).
      record_routing: a mixture of experts: record every token's experts (module docstring);
        ignored for a dense model.
    """

    def __init__(
        self,
        params,
        config: ModelConfig,
        *,
        sampling: SamplingConfig = SamplingConfig(),
        seed: int = 0,
        num_slots: int = 16,
        page_size: int = 16,
        max_len: int = 256,
        gen_len: int = 128,
        num_pages: int | None = None,
        chunk_steps: int = 16,
        dtype: str | None = None,
        version: int = 0,
        record_routing: bool = False,
    ):
        for name, value in (
            ("num_slots", num_slots),
            ("page_size", page_size),
            ("chunk_steps", chunk_steps),
            ("max_len", max_len),
        ):
            if int(value) < 1:
                raise ConfigError(f"paged engine: {name} must be >= 1, got {value}")
        self._model_config, self._dtype = config, dtype
        self.record_routing = bool(record_routing) and config.is_moe
        self.params, self.config = cast_for_rollout(params, config, dtype)
        self.version = int(version)
        self.sampling, self.seed = sampling, int(seed)
        self.num_slots, self.gen_len, self.chunk_steps = int(num_slots), int(gen_len), chunk_steps
        self.width = pages_for(max_len, page_size)
        num_pages = num_slots * self.width + 1 if num_pages is None else int(num_pages)
        self.book = PageTable(num_pages, page_size)
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        ids = stop_token_ids(config, sampling)
        stop = np.full((max(8, -(-len(ids) // 8) * 8),), -1, np.int32)
        stop[: len(ids)] = ids
        self._stop = jnp.asarray(stop)
        self._sampling = dataclasses.replace(sampling, stop_token_ids=(), use_model_eos=False)
        s, m = self.num_slots, self.gen_len
        conv, rec_state = (
            init_recurrent_state(self.config, s) if self.config.is_hybrid else (None, None)
        )
        self.state = SlotState(
            cache=init_paged_cache(self.config, num_pages, page_size),
            table=jnp.zeros((s, self.width), jnp.int32),
            cache_len=jnp.zeros((s,), jnp.int32),
            logits=jnp.zeros((s, config.vocab_size), jnp.float32),
            keys=jnp.zeros((s, 2), jnp.uint32),
            key_offset=jnp.zeros((s,), jnp.int32),
            gen=jnp.zeros((s,), jnp.int32),
            budget=jnp.zeros((s,), jnp.int32),
            active=jnp.zeros((s,), bool),
            finished=jnp.zeros((s,), bool),
            tokens=jnp.zeros((s, m), jnp.int32),
            logprobs=jnp.zeros((s, m), jnp.float32),
            routing=jnp.zeros(
                (s, m, config.num_layers, config.num_experts_per_tok), routing_dtype(config)
            )
            if self.record_routing
            else None,
            conv=conv,
            state=rec_state,
        )
        self.rows: list[Row] = []
        self._waiting: collections.deque[list[int]] = collections.deque()  # groups of rows
        # rows to continue: (row, the logits their next token is drawn from, their version,
        # a hybrid stack's recurrent state of the row or None)
        self._resume: collections.deque[tuple[int, jax.Array, int, Any]] = collections.deque()
        # a hybrid stack's kept, finished rows: their recurrent state (conv, state) [L', 1, ...]
        self._row_rec: dict[int, Any] = {}
        self._slot_row: list[int | None] = [None] * s
        self._gen: dict[int, int] = {}  # live row -> tokens generated in its turn so far
        self._logit_version = [0] * s  # per slot: the version of the logits it samples next
        self._turn_versions: dict[int, list[int]] = {}  # live row -> its turn's token versions
        # chunks, prefills, refills; live_rows and pages_held summed over chunks
        self.stats: collections.Counter = collections.Counter()

    # ----- requests ---------------------------------------------------------------------------

    def submit(
        self,
        prompt: list[int],
        *,
        prompt_id: int,
        num_samples: int = 1,
        max_new_tokens: int | list[int] = 128,
        keep: bool = False,
        first_sample: int = 0,
    ) -> list[int]:
        """Queue G samples of a prompt (a group: prefilled once); returns their row ids.

        ``max_new_tokens`` may be one budget per sample (≤ gen_len). ``keep`` holds the rows'
        pages after they finish, for :meth:`extend`; :meth:`release` frees them. The samples
        are keyed ``(prompt_id, first_sample + g)``: submitting a group's samples one at a
        time with their own ``first_sample`` draws what the whole group would.
        """
        if isinstance(max_new_tokens, int):
            budgets = [max_new_tokens] * num_samples
        else:
            budgets = [int(b) for b in max_new_tokens]
        if len(budgets) != num_samples or not all(1 <= b <= self.gen_len for b in budgets):
            raise ConfigError(f"need {num_samples} budgets in [1, {self.gen_len}], got {budgets}")
        if not prompt or len(prompt) + max(budgets) > self.width * self.book.page_size:
            raise ConfigError(f"prompt of {len(prompt)} tokens + budget exceeds max_len")
        if num_samples > self.num_slots:
            raise ConfigError(f"a group of {num_samples} needs more than {self.num_slots} slots")
        ids = list(range(len(self.rows), len(self.rows) + num_samples))
        for g, b in enumerate(budgets):
            row = Row(
                list(prompt), int(prompt_id), first_sample + g, int(b), keep, cache_len=len(prompt)
            )
            self.rows.append(row)
        self._waiting.append(ids)
        return ids

    def extend(self, row_id: int, tokens: list[int], *, max_new_tokens: int) -> jax.Array:
        """Append ``tokens`` (mask 0, no log-prob) to a kept, finished row and queue its next
        turn of ≤ ``max_new_tokens`` tokens; the appended tokens run through the paged cache
        (a T-token forward), the conversation is not prefilled again. Returns the float32
        logits ``[V]`` of the next token (those its next turn starts from)."""
        row = self.rows[row_id]
        if not (row.keep and row.done and row_id in self.book.pages):
            raise ConfigError(f"row {row_id} is not a kept, finished row")
        if not tokens or not 1 <= max_new_tokens <= self.gen_len:
            raise ConfigError("extend needs >= 1 token and 1 <= max_new_tokens <= gen_len")
        start = row.cache_len
        if start + len(tokens) + max_new_tokens > self.width * self.book.page_size:
            raise ConfigError(f"row {row_id} would exceed max_len")
        self.book.grow(row_id, start + len(tokens))
        t = bucket_length(len(tokens))
        padded = np.full((1, t), self.pad_id, np.int32)
        padded[0, : len(tokens)] = tokens
        logits, cache, experts, rec = extend_row(
            self.params,
            self.state.cache,
            jnp.asarray(padded),
            jnp.asarray(self.book.table([row_id], self.width)),
            jnp.asarray([start], jnp.int32),
            jnp.asarray([len(tokens) - 1], jnp.int32),
            self._row_rec.pop(row_id, None),
            config=self.config,
        )
        self.state = self.state._replace(cache=cache)
        if self.record_routing and experts is not None:
            row.routing.append(np.asarray(experts[0, : len(tokens)], routing_dtype(self.config)))
        row.tokens += list(tokens)
        row.mask += [0] * len(tokens)
        row.logprobs += [0.0] * len(tokens)
        row.cache_len, row.budget, row.turn_start = (
            start + len(tokens),
            max_new_tokens,
            len(row.tokens),
        )
        row.done = row.finished = False
        row.versions += [-1] * len(tokens)
        self._resume.append((row_id, logits, self.version, rec))
        return logits[0]

    def swap(self, params, version: int) -> None:
        """Decode with new weights from the next chunk on (same shapes: nothing recompiles).
        Rows in flight keep their KV cache and continue (a partial rollout); tokens drawn from
        here on record ``version``."""
        self.params, _ = cast_for_rollout(params, self._model_config, self._dtype)
        self.version = int(version)
        self.stats["swaps"] += 1

    def release(self, row_id: int) -> None:
        """Free a kept row's pages."""
        if row_id in self.book.pages:
            self.book.free(row_id)
        self._row_rec.pop(row_id, None)

    # ----- the loop ---------------------------------------------------------------------------

    def run(self) -> list[Row]:
        """Decode until every queued row and turn is done; returns all rows (by row id)."""
        while self.busy:
            self.step()
        return self.rows

    @property
    def busy(self) -> bool:
        """Rows are queued, waiting to resume, or decoding."""
        return bool(self._waiting or self._resume or any(r is not None for r in self._slot_row))

    def step(self) -> list[int]:
        """One scheduling round: refill free slots, decode one chunk of ≤ ``chunk_steps``
        steps, collect. Returns the ids of the rows whose turn ended in this chunk (a caller
        that drives turns itself, e.g. an environment loop, extends them between steps);
        ``[]`` when nothing is queued."""
        return self.collect() if self.launch() else []

    def launch(self) -> bool:
        """The first half of :meth:`step`: refill free slots and dispatch one decode chunk,
        without waiting for it (JAX dispatches asynchronously). False when nothing is live.
        Replicas on different devices (:func:`jaxrl_llm.sampling.generate_paged` on a mesh)
        launch each, then :meth:`collect` each, so their chunks run at the same time."""
        self._fill_slots()
        live = [(i, r) for i, r in enumerate(self._slot_row) if r is not None]
        if not live:
            if self._waiting or self._resume:
                raise ConfigError("the page pool cannot hold the next group; raise num_pages")
            return False
        for _, r in live:  # pages one chunk ahead
            row = self.rows[r]
            left = row.budget - self._gen[r]
            self.book.grow(r, row.cache_len + min(self.chunk_steps, left))
        width = min(bucket_length(max(len(self.book.pages[r]) for _, r in live), POW2), self.width)
        table = jnp.asarray(self.book.table(self._slot_row, self.width))
        self.state = decode_chunk(
            self.params,
            self.state._replace(table=table),
            self._stop,
            jnp.asarray(self.chunk_steps, jnp.int32),
            config=self.config,
            sampling=self._sampling,
            pad_id=self.pad_id,
            width=width,
        )
        self.stats["chunks"] += 1
        self.stats["live_rows"] += len(live)  # summed over chunks: mean KV held per row
        self.stats["pages_held"] += self.book.alloc.num_pages - 1 - self.book.alloc.num_free
        return True

    def _reserve(self, r: int) -> int:
        """Pages row ``r`` may still need to finish its turn."""
        row = self.rows[r]
        end = len(row.prompt) + row.turn_start + row.budget
        return pages_for(end, self.book.page_size) - len(self.book.pages.get(r, []))

    def _fill_slots(self) -> None:
        free = [i for i, r in enumerate(self._slot_row) if r is None]
        while self._resume and free:  # continued rows first: they already hold their pages
            r, logits, version, rec = self._resume.popleft()
            self._start([(free.pop(0), r, 0)], logits, version, rec)
        z = self.book.page_size
        reserved = sum(self._reserve(r) for r in self._slot_row if r is not None)
        admitted: list[tuple[int, int, int]] = []  # (slot, row, index into the logits source)
        groups: list[tuple[list[int], list[int]]] = []
        cow: list[tuple[int, int]] = []
        while self._waiting and len(self._waiting[0]) <= len(free):
            ids = self._waiting[0]
            plen = len(self.rows[ids[0]].prompt)
            worst = sum(pages_for(plen + self.rows[r].budget, z) for r in ids)
            worst -= (len(ids) - 1) * (plen // z)  # full prompt pages are held once
            if self.book.alloc.num_free - reserved < worst:
                break
            pages, pairs = self.book.add_group(ids, plen)
            reserved += worst - pages_for(plen, z) - len(pairs)
            self._waiting.popleft()
            cow += pairs
            for r in ids:
                admitted.append((free.pop(0), r, len(groups)))
            groups.append((ids, pages))
        if groups:
            self.stats["prefills"] += 1
            self.stats["refills"] += bool(self.stats["chunks"])  # admitted after decoding began
            self._prefill(groups, cow, admitted)

    def _prefill(self, groups, cow, admitted) -> None:
        a = bucket_length(len(groups), POW2)
        prompts = [self.rows[ids[0]].prompt for ids, _ in groups]
        p = bucket_length(max(len(x) for x in prompts))
        tokens, mask = pad_prompts(prompts + [[self.pad_id]] * (a - len(groups)), length=p)
        args = (self.params, jnp.asarray(tokens), jnp.asarray(mask))
        if self.record_routing:
            logits, dense, _, routing = prefill_with_routing(*args, config=self.config, cache_len=p)
            host = np.asarray(routing)
            for i, (ids, _) in enumerate(groups):  # left-padded: the last len(prompt) columns
                for r in ids:
                    self.rows[r].prompt_routing = host[i, p - len(prompts[i]) :]
        else:
            logits, dense, _ = prefill(*args, config=self.config, cache_len=p)
        n = pages_for(p, self.book.page_size)
        pages = np.full((a, n), NULL_PAGE, np.int32)
        for i, (_, pg) in enumerate(groups):
            pages[i, : len(pg)] = pg
        lens = np.ones((a,), np.int32)
        lens[: len(groups)] = [len(x) for x in prompts]
        cache = store_prompts(self.state.cache, dense.k, dense.v, jnp.asarray(lens), pages)
        pairs = np.zeros((self.num_slots, 2), np.int32)  # null → null copies pad the list
        if cow:
            pairs[: len(cow)] = cow
        cache = cow_copy(cache, jnp.asarray(pairs[:, 0]), jnp.asarray(pairs[:, 1]))
        self.state = self.state._replace(cache=cache)
        rec = (dense.conv, dense.state) if self.config.is_hybrid else None
        self._start(admitted, logits, self.version, rec)

    def _start(self, admitted, src_logits, version: int, src_rec=None) -> None:
        s = self.num_slots
        slots = np.full((s,), s, np.int32)
        src, off, clen, budget = (np.zeros((s,), np.int32) for _ in range(4))
        ids = np.zeros((s, 2), np.int32)
        for i, (slot, r, j) in enumerate(admitted):
            row = self.rows[r]
            slots[i], src[i], off[i], budget[i] = slot, j, row.steps, row.budget
            clen[i] = row.cache_len
            ids[i] = row.prompt_id, row.sample_id
            self._slot_row[slot] = r
            self._gen[r] = 0
            self._logit_version[slot] = version
            self._turn_versions[r] = []
        self.state = admit_rows(
            self.state,
            slots,
            src_logits,
            src,
            np.uint32(self.seed),
            ids,
            off,
            clen,
            budget,
            src_rec,
        )

    def collect(self) -> list[int]:
        """The second half of :meth:`step`: wait for the chunk :meth:`launch` dispatched and
        hand finished rows back (their ids)."""
        st = self.state
        ended: list[int] = []
        active, gen, fin = jax.device_get((st.active, st.gen, st.finished))
        out_tok, out_lp = jax.device_get((st.tokens, st.logprobs))
        out_routing = None if st.routing is None else jax.device_get(st.routing)
        for slot, r in enumerate(self._slot_row):
            if r is None:
                continue
            row = self.rows[r]
            g = int(gen[slot])
            new = g - self._gen[r]  # drawn in this chunk: the first from the logits it began
            if new > 0:  # with, the others from this chunk's weights
                vs = self._turn_versions[r]
                vs += [self._logit_version[slot]] + [self.version] * (new - 1)
                self._logit_version[slot] = self.version
            self._gen[r] = g
            row.cache_len = len(row.prompt) + row.turn_start + g
            if active[slot]:
                continue
            row.tokens += out_tok[slot, :g].tolist()
            row.mask += [1] * g
            row.logprobs += out_lp[slot, :g].tolist()
            if out_routing is not None:
                row.routing.append(out_routing[slot, :g])
            row.steps += g
            row.versions += self._turn_versions.pop(r)
            row.finished, row.done = bool(fin[slot]), True
            self._slot_row[slot] = None
            del self._gen[r]
            ended.append(r)
            if not row.keep:
                self.book.free(r)
            elif st.conv is not None and st.state is not None:  # its state, for an extension
                self._row_rec[r] = (st.conv[:, slot : slot + 1], st.state[:, slot : slot + 1])
        return ended
