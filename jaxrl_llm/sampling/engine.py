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

On a mesh (``mesh``: the sampler's) the engine runs R data-parallel replicas, one per position
on the mesh's batch axes (:func:`jaxrl_llm.sampling.rows.replica_axes`). Each replica has its
own S slots, page pool, queues and page tables on the host (a group runs whole on one
replica); their device state is stacked, replica dimension first, and split over the batch
axes, while the weights stay as they are on the mesh. Each device program (prefill, the
prompt-page writes, admission, the decode chunk, extensions) is one jitted program over the
whole mesh that runs every replica's part at once (:func:`jaxrl_llm.sampling.slots.over_replicas`),
so it compiles once, not once per replica, and one launch per round decodes every replica's
chunk. A replica with nothing to do runs idle slots (they write only the null page).
Weights split over a batch axis (``fsdp``, the learner's layout) are gathered whole into each
replica once per program call (a chunk: outside its decode loop), so every device then holds
them whole; a run's sampler gets a ``data`` × ``tensor`` copy instead
(:mod:`jaxrl_llm.parallel.placement`).

The host's records (:class:`Row`, each replica's page table, queues and slots, the host arrays
each program takes) are :mod:`.engine_rows`; here the engine that schedules them and calls
the device programs of :mod:`.slots`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import ModelConfig, init_paged_cache, init_recurrent_state
from jaxrl_llm.sampling.config import SamplingConfig, bucket_length
from jaxrl_llm.sampling.decode import routing_dtype
from jaxrl_llm.sampling.engine_rows import (
    Replica,
    Row,
    Start,
    extend_arrays,
    layout_routing,
    prefill_arrays,
    resume_arrays,
    start_arrays,
)
from jaxrl_llm.sampling.paged import pages_for
from jaxrl_llm.sampling.rows import row_split
from jaxrl_llm.sampling.slots import (
    POW2,
    SlotState,
    admit_rows,
    cast_for_rollout,
    cow_copy,
    decode_chunk,
    extend_row,
    prefill_prompts,
    replica_shardings,
    store_prompts,
)
from jaxrl_llm.sampling.static_generate import decode_params, stop_token_ids

# Row and layout_routing live in engine_rows; imported from here too
__all__ = ["PagedEngine", "Row", "layout_routing"]


class PagedEngine:
    """Continuous batching of sequences over S slots and a paged KV cache (see module doc).

    Args:
      params, config: the model (cast with ``dtype`` = 'bfloat16' for a bfloat16 rollout);
        ``params`` laid out on ``mesh`` when one is given.
      sampling: :class:`SamplingConfig`; seed: keys rows as the static engine does.
      num_slots: S rows decoded together per replica; page_size: Z slots per page.
      max_len: longest prompt + conversation a row may reach (sets the table width W).
      gen_len: M, the most tokens one turn generates (width of the slot buffers).
      num_pages: pool size per replica (default: enough for S rows of ``max_len`` + the
        null page).
      chunk_steps: decode steps per jitted chunk between host refills.
      dtype: None, 'float32' or 'bfloat16'.
      version: the weights' version (recorded per sampled token; :meth:`swap` changes it).
      record_routing: a mixture of experts: record every token's experts (module docstring);
        ignored for a dense model.
      mesh: the sampler's mesh (None: one device). One replica per position on its batch
        axes (:func:`jaxrl_llm.sampling.rows.replica_axes`), each with S slots and its own
        page pool; every replica's device state is stacked (replica dimension first) and
        split over those axes, and each program runs all replicas at once (module doc).
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
        mesh: Mesh | None = None,
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
        params, self.config = cast_for_rollout(params, config, dtype)
        self.params = decode_params(params, self.config)  # separate layers on GPU
        self.version = int(version)
        self.sampling, self.seed = sampling, int(seed)
        self.num_slots, self.gen_len, self.chunk_steps = int(num_slots), int(gen_len), chunk_steps
        self.page_size = int(page_size)
        self.width = pages_for(max_len, page_size)
        num_pages = num_slots * self.width + 1 if num_pages is None else int(num_pages)
        self.mesh = mesh
        self.num_replicas = row_split(mesh)
        self.replicas = [
            Replica(num_pages, page_size, self.num_slots) for _ in range(self.num_replicas)
        ]
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        ids = stop_token_ids(config, sampling)
        stop = np.full((max(8, -(-len(ids) // 8) * 8),), -1, np.int32)
        stop[: len(ids)] = ids
        self._stop = jnp.asarray(stop)
        self._sampling = dataclasses.replace(sampling, stop_token_ids=(), use_model_eos=False)
        self.state = self._empty_state(num_pages)
        self.rows: list[Row] = []
        self._replica_of: list[int] = []  # row -> its replica
        self._next = 0  # the replica the next group goes to by default
        # a hybrid stack's kept, finished rows: their recurrent state (conv, state) [L', 1, ...]
        self._row_rec: dict[int, Any] = {}
        # chunks, prefills, refills; live_rows and pages_held summed over chunks
        self.stats: collections.Counter = collections.Counter()

    def _empty_state(self, num_pages: int) -> SlotState:
        """Every replica's empty slots and pool, ``[R, ...]`` per leaf (split over the
        replica axes on a mesh)."""
        s, m, c = self.num_slots, self.gen_len, self.config

        def one():
            conv, rec_state = init_recurrent_state(c, s) if c.is_hybrid else (None, None)
            return SlotState(
                cache=init_paged_cache(c, num_pages, self.page_size),
                table=jnp.zeros((s, self.width), jnp.int32),
                cache_len=jnp.zeros((s,), jnp.int32),
                logits=jnp.zeros((s, c.vocab_size), jnp.float32),
                keys=jnp.zeros((s, 2), jnp.uint32),
                key_offset=jnp.zeros((s,), jnp.int32),
                gen=jnp.zeros((s,), jnp.int32),
                budget=jnp.zeros((s,), jnp.int32),
                active=jnp.zeros((s,), bool),
                finished=jnp.zeros((s,), bool),
                tokens=jnp.zeros((s, m), jnp.int32),
                logprobs=jnp.zeros((s, m), jnp.float32),
                routing=jnp.zeros((s, m, c.num_layers, c.num_experts_per_tok), routing_dtype(c))
                if self.record_routing
                else None,
                conv=conv,
                state=rec_state,
            )

        shapes = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((self.num_replicas, *x.shape), x.dtype),
            jax.eval_shape(one),
        )
        if self.mesh is None:
            return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        shardings = replica_shardings(shapes, self.mesh)
        return jax.tree.map(lambda x, sh: jnp.zeros(x.shape, x.dtype, device=sh), shapes, shardings)

    def _put(self, x: np.ndarray) -> jax.Array:
        """A host array of every replica's values (replica first), split over the replicas."""
        if self.mesh is None:
            return jnp.asarray(x)
        return jax.device_put(
            x, replica_shardings(jax.ShapeDtypeStruct(x.shape, x.dtype), self.mesh)
        )

    def _put_all(self, xs: tuple[np.ndarray, ...] | None) -> tuple[jax.Array, ...] | None:
        """:meth:`_put` of each array of ``xs`` (None stays None)."""
        return None if xs is None else tuple(self._put(x) for x in xs)

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
        replica: int | None = None,
    ) -> list[int]:
        """Queue G samples of a prompt (a group: prefilled once); returns their row ids.

        ``max_new_tokens`` may be one budget per sample (≤ gen_len). ``keep`` holds the rows'
        pages after they finish, for :meth:`extend`; :meth:`release` frees them. The samples
        are keyed ``(prompt_id, first_sample + g)``: submitting a group's samples one at a
        time with their own ``first_sample`` draws what the whole group would. ``replica``:
        the replica the group runs on (default: the groups are dealt out in turn).
        """
        if isinstance(max_new_tokens, int):
            budgets = [max_new_tokens] * num_samples
        else:
            budgets = [int(b) for b in max_new_tokens]
        if len(budgets) != num_samples or not all(1 <= b <= self.gen_len for b in budgets):
            raise ConfigError(f"need {num_samples} budgets in [1, {self.gen_len}], got {budgets}")
        if not prompt or len(prompt) + max(budgets) > self.width * self.page_size:
            raise ConfigError(f"prompt of {len(prompt)} tokens + budget exceeds max_len")
        if num_samples > self.num_slots:
            raise ConfigError(f"a group of {num_samples} needs more than {self.num_slots} slots")
        k = self._next if replica is None else int(replica)
        if not 0 <= k < self.num_replicas:
            raise ConfigError(f"replica {k} of {self.num_replicas}")
        self._next = (k + 1) % self.num_replicas
        ids = list(range(len(self.rows), len(self.rows) + num_samples))
        for g, b in enumerate(budgets):
            row = Row(
                list(prompt), int(prompt_id), first_sample + g, int(b), keep, cache_len=len(prompt)
            )
            self.rows.append(row)
            self._replica_of.append(k)
        self.replicas[k].waiting.append(ids)
        return ids

    def replica_of(self, row_id: int) -> int:
        """The replica row ``row_id`` runs on."""
        return self._replica_of[row_id]

    def extend(self, row_id: int, tokens: list[int], *, max_new_tokens: int) -> jax.Array:
        """Append ``tokens`` (mask 0, no log-prob) to a kept, finished row and queue its next
        turn of ≤ ``max_new_tokens`` tokens; the appended tokens run through the paged cache
        (a T-token forward), the conversation is not prefilled again. Returns the float32
        logits ``[V]`` of the next token (those its next turn starts from)."""
        row, k = self.rows[row_id], self._replica_of[row_id]
        book = self.replicas[k].book
        if not (row.keep and row.done and row_id in book.pages):
            raise ConfigError(f"row {row_id} is not a kept, finished row")
        if not tokens or not 1 <= max_new_tokens <= self.gen_len:
            raise ConfigError("extend needs >= 1 token and 1 <= max_new_tokens <= gen_len")
        start = row.cache_len
        if start + len(tokens) + max_new_tokens > self.width * self.page_size:
            raise ConfigError(f"row {row_id} would exceed max_len")
        book.grow(row_id, start + len(tokens))
        n = self.num_replicas
        table = book.table([row_id], self.width)
        host = extend_arrays(tokens, k, n, table=table, start=start, pad_id=self.pad_id)
        rec = None
        if self.config.is_hybrid:
            st = self.state
            assert st.conv is not None and st.state is not None
            shapes = (st.conv.shape, st.state.shape)
            rec = tuple(
                np.zeros((n, sh[1], 1, *sh[3:]), d)
                for sh, d in zip(shapes, (st.conv.dtype, st.state.dtype))
            )
            own = self._row_rec.pop(row_id, None)
            if own is not None:
                rec[0][k], rec[1][k] = own
        logits, cache, experts, rec = extend_row(
            self.params,
            self.state.cache,
            *(self._put(x) for x in host),
            self._put_all(rec),
            config=self.config,
            mesh=self.mesh,
        )
        self.state = self.state._replace(cache=cache)
        if self.record_routing and experts is not None:
            row.routing.append(np.asarray(experts[k, 0, : len(tokens)], routing_dtype(self.config)))
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
        out = np.asarray(logits[k])  # [1, V]
        own_rec = None if rec is None else (np.asarray(rec[0][k]), np.asarray(rec[1][k]))
        self.replicas[k].resume.append((row_id, out, self.version, own_rec))
        return jnp.asarray(out[0])

    def swap(self, params, version: int) -> None:
        """Decode with new weights from the next chunk on (same shapes: nothing recompiles).
        Rows in flight keep their KV cache and continue (a partial rollout); tokens drawn from
        here on record ``version``."""
        params, _ = cast_for_rollout(params, self._model_config, self._dtype)
        self.params = decode_params(params, self.config)
        self.version = int(version)
        self.stats["swaps"] += 1

    def release(self, row_id: int) -> None:
        """Free a kept row's pages."""
        book = self.replicas[self._replica_of[row_id]].book
        if row_id in book.pages:
            book.free(row_id)
        self._row_rec.pop(row_id, None)

    # ----- the loop ---------------------------------------------------------------------------

    def run(self) -> list[Row]:
        """Decode until every queued row and turn is done; returns all rows (by row id)."""
        while self.busy:
            self.step()
        return self.rows

    @property
    def busy(self) -> bool:
        """Rows are queued, waiting to resume, or decoding (on any replica)."""
        return any(rep.waiting or rep.resume or rep.live() for rep in self.replicas)

    def step(self) -> list[int]:
        """One scheduling round: refill free slots, decode one chunk of ≤ ``chunk_steps``
        steps on every replica, collect. Returns the ids of the rows whose turn ended in this
        chunk (a caller that drives turns itself, e.g. an environment loop, extends them
        between steps); ``[]`` when nothing is queued."""
        return self.collect() if self.launch() else []

    def launch(self) -> bool:
        """The first half of :meth:`step`: refill free slots and dispatch one decode chunk
        of every replica (one program), without waiting for it (JAX dispatches
        asynchronously). False when nothing is live."""
        self._fill_slots()
        lives = [rep.live() for rep in self.replicas]
        for rep, live in zip(self.replicas, lives, strict=True):
            if not live and (rep.waiting or rep.resume):
                raise ConfigError("the page pool cannot hold the next group; raise num_pages")
        if not any(lives):
            return False
        # pages one chunk ahead
        held = max(rep.grow_ahead(self.rows, self.chunk_steps) for rep in self.replicas)
        width = min(bucket_length(held, POW2), self.width)
        table = np.stack([rep.book.table(rep.slot_row, self.width) for rep in self.replicas])
        self.state = decode_chunk(
            self.params,
            self.state._replace(table=self._put(table)),
            self._stop,
            jnp.asarray(self.chunk_steps, jnp.int32),
            config=self.config,
            sampling=self._sampling,
            pad_id=self.pad_id,
            width=width,
            mesh=self.mesh,
        )
        self.stats["chunks"] += 1
        self.stats["live_rows"] += sum(map(len, lives))  # summed over chunks: mean KV per row
        self.stats["pages_held"] += sum(
            rep.book.alloc.num_pages - 1 - rep.book.alloc.num_free for rep in self.replicas
        )
        return True

    def _fill_slots(self) -> None:
        frees = [rep.free_slots() for rep in self.replicas]
        # continued rows first: they already hold their pages
        resumed = [rep.take_resumed(free) for rep, free in zip(self.replicas, frees, strict=True)]
        if any(starts for starts, _ in resumed):
            logits, rec = resume_arrays([src for _, src in resumed], self.config.vocab_size)
            self._start([starts for starts, _ in resumed], self._put(logits), self._put_all(rec))
        admitted = [
            rep.admit(self.rows, free, self.version)
            for rep, free in zip(self.replicas, frees, strict=True)
        ]
        groups = [g for _, g, _ in admitted]
        if any(groups):
            self.stats["prefills"] += 1
            self.stats["refills"] += bool(self.stats["chunks"])  # admitted after decoding began
            self._prefill(groups, [c for _, _, c in admitted], [st for st, _, _ in admitted])

    def _prefill(self, groups, cow, admitted: list[list[Start]]) -> None:
        host = prefill_arrays(
            self.rows,
            groups,
            cow,
            pad_id=self.pad_id,
            page_size=self.page_size,
            num_slots=self.num_slots,
        )
        p = host.width
        logits, k_, v_, rec, routing = prefill_prompts(
            self.params,
            self._put(host.tokens),
            self._put(host.mask),
            config=self.config,
            cache_len=p,
            record_routing=self.record_routing,
            mesh=self.mesh,
        )
        if self.record_routing:
            experts = np.asarray(routing)
            for k, gs in enumerate(groups):  # left-padded: the last len(prompt) columns
                for i, (ids, _) in enumerate(gs):
                    for r in ids:
                        self.rows[r].prompt_routing = experts[k, i, p - len(host.prompts[k][i]) :]
        cache = store_prompts(
            self.state.cache,
            k_,
            v_,
            self._put(host.lens),
            self._put(host.pages),
            mesh=self.mesh,
        )
        src, dst = self._put(host.pairs[..., 0]), self._put(host.pairs[..., 1])
        self.state = self.state._replace(cache=cow_copy(cache, src, dst, mesh=self.mesh))
        self._start(admitted, logits, rec)

    def _start(self, starts: list[list[Start]], src_logits, src_rec=None) -> None:
        """Start each replica's rows ``starts`` (slot, row, source index, version)."""
        slots, src, ids, off, clen, budget = start_arrays(
            self.rows, self.replicas, starts, self.num_slots
        )
        self.state = admit_rows(
            self.state,
            self._put(slots),
            src_logits,
            self._put(src),
            np.uint32(self.seed),
            self._put(ids),
            self._put(off),
            self._put(clen),
            self._put(budget),
            src_rec,
            mesh=self.mesh,
        )

    def collect(self) -> list[int]:
        """The second half of :meth:`step`: wait for the chunk :meth:`launch` dispatched and
        hand finished rows back (their ids)."""
        st = self.state
        active, gen, fin = jax.device_get((st.active, st.gen, st.finished))
        out_tok, out_lp = jax.device_get((st.tokens, st.logprobs))
        out_routing = None if st.routing is None else jax.device_get(st.routing)
        ended: list[int] = []
        for k, rep in enumerate(self.replicas):
            out: dict[str, Any] = dict(active=active[k], gen=gen[k], finished=fin[k])
            out |= dict(tokens=out_tok[k], logprobs=out_lp[k])
            out["routing"] = None if out_routing is None else out_routing[k]
            for slot, r in rep.collect(self.rows, out, self.version):
                ended.append(r)
                if self.rows[r].keep and st.conv is not None and st.state is not None:
                    self._row_rec[r] = (  # its recurrent state, to extend
                        np.asarray(st.conv[k, :, slot : slot + 1]),
                        np.asarray(st.state[k, :, slot : slot + 1]),
                    )
        return ended
