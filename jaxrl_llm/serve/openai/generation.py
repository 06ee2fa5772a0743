"""Generation for the OpenAI-compatible endpoint: requests from every route decoded together on
the paged engine, with continuous batching across requests.

A request is a :class:`Job`: one prompt's token ids, its ``n`` samples, its
:class:`~jaxrl_llm.sampling.SamplingConfig` and budget. Jobs reach the server's one
:class:`~jaxrl_llm.serve.EngineLoop` as kind ``openai.admit``; the handler submits each to the
:class:`~jaxrl_llm.sampling.PagedEngine` of its sampling config (the config is a static part
of the decode program, so requests with different temperatures get engines of their own,
created on first use and kept, at most ``max_engines``) and queues one ``openai.step``. A step
decodes one chunk on every busy engine, hands finished rows to their jobs and, while any
engine is busy, queues the next step behind whatever arrived meanwhile: a request that comes
in while others decode joins them at the next chunk boundary (Orca's iteration-level
scheduling, Yu et al. 2022, https://www.usenix.org/conference/osdi22/presentation/yu, at the
paged engine's chunk granularity).

A request's samples are keyed ``(seed, prompt_id, sample)`` as the engine keys every row:
``prompt_id`` is the request's ``seed`` when it gives one (the same request with the same
seed draws the same tokens, whatever else runs beside it), else a random 31-bit number.

Every sampled token carries the behaviour log-prob the engine recorded,
log softmax(z / τ)[token] (τ = 1 for greedy requests), the same quantity the trainer's
``jaxrl_llm.ops.token_logprobs(..., temperature=τ)`` computes. ``top_logprobs`` need the whole
distribution, which the engine does not keep: a job that asks for them gets one teacher-forced
forward of its prompt and completions (:func:`top_logprobs`) when it finishes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import random
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import ModelConfig, forward
from jaxrl_llm.sampling import PagedEngine, SamplingConfig
from jaxrl_llm.sampling.config import bucket_length

#: OpenAI's largest ``top_logprobs``; the forward always computes this many (one program).
MAX_TOP_LOGPROBS = 20
#: Length buckets of the top-log-prob forward (powers of two from 16).
_BUCKETS = tuple(2**i for i in range(4, 20))


@dataclasses.dataclass
class Sample:
    """One choice of a job: the tokens the engine drew and their behaviour log-probs.

    ``finished``: the row ended on a stop token (else it reached its budget).
    ``top``: per token, ``[(token id, log-prob), ...]`` best first (only when asked).
    ``version``: the weights' version of each token (the engine's ``Row.versions``).
    """

    tokens: list[int]
    logprobs: list[float]
    finished: bool
    versions: list[int]
    top: list[list[tuple[int, float]]] | None = None


@dataclasses.dataclass
class Job:
    """One prompt's request: ``n`` samples of ``max_tokens`` under ``sampling``.

    ``episode``: the episode whose turn this is (recorded by the routes), if any.
    ``on_progress(index, tokens, logprobs)`` (optional) is called from the engine thread after
    every chunk with each unfinished sample's tokens so far (streaming); ``future`` resolves to
    the list of :class:`Sample` (one per choice) or to the error that failed the job.
    """

    prompt: list[int]
    n: int
    max_tokens: int
    sampling: SamplingConfig
    prompt_id: int | None = None
    top_logprobs: int = 0
    episode: str | None = None
    on_progress: Callable[[int, list[int], list[float]], None] | None = None
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)


@functools.partial(jax.jit, static_argnames=("config", "k"))
def _top_program(params, tokens, temperature, *, config: ModelConfig, k: int):
    logits, _ = forward(params, tokens, config=config)
    logp = jax.nn.log_softmax(logits / temperature, axis=-1)
    return jax.lax.top_k(logp, k)


def top_logprobs(
    params, config: ModelConfig, prompt: list[int], completions: list[list[int]], temperature: float
) -> list[list[list[tuple[int, float]]]]:
    """The :data:`MAX_TOP_LOGPROBS` most likely tokens at every completion position.

    One teacher-forced forward of ``prompt + completion`` per completion (right-padded to a
    power-of-two bucket: causal attention makes the padding invisible to earlier positions),
    log softmax(z / τ) as the engine records it.

    Returns:
      per completion, per token: ``[(token id, log-prob), ...]`` best first.
    """
    p = len(prompt)
    longest = max(p + len(c) for c in completions)
    width = bucket_length(longest, _BUCKETS)
    tokens = np.zeros((len(completions), width), np.int32)
    for i, c in enumerate(completions):
        tokens[i, : p + len(c)] = prompt + c
    vals, idx = _top_program(
        params,
        jnp.asarray(tokens),
        jnp.asarray(temperature, jnp.float32),
        config=config,
        k=min(MAX_TOP_LOGPROBS, config.vocab_size),
    )
    vals, idx = np.asarray(vals), np.asarray(idx)
    return [
        [list(zip(idx[i, t].tolist(), vals[i, t].tolist())) for t in range(p - 1, p - 1 + len(c))]
        for i, c in enumerate(completions)
    ]


@dataclasses.dataclass
class _Live:
    job: Job
    engine: PagedEngine
    rows: list[int]
    left: int


class Generator:
    """The paged engines of one served model and the engine-loop handlers that drive them.

    Args:
      params, config: the model (``params`` float32; ``dtype`` casts the engines' copy).
      loop: the server's :class:`~jaxrl_llm.serve.EngineLoop` (handlers are registered here).
      seed: the engines' seed (a row's key is ``(seed, prompt_id, sample)``).
      num_slots, page_size, max_len, gen_len, chunk_steps, dtype: each engine's
        (:class:`~jaxrl_llm.sampling.PagedEngine`); ``max_len`` bounds prompt + completion,
        ``gen_len`` a completion.
      max_engines: sampling configs kept at once (an idle engine is dropped for a new one).
    """

    def __init__(
        self,
        params,
        config: ModelConfig,
        loop,
        *,
        seed: int = 0,
        num_slots: int = 16,
        page_size: int = 16,
        max_len: int = 2048,
        gen_len: int = 512,
        chunk_steps: int = 16,
        dtype: str | None = None,
        max_engines: int = 4,
    ):
        self.params, self.config, self.loop = params, config, loop
        self.engine_kw: dict[str, Any] = dict(
            seed=seed,
            num_slots=num_slots,
            page_size=page_size,
            max_len=max_len,
            gen_len=gen_len,
            chunk_steps=chunk_steps,
            dtype=dtype,
        )
        self.max_len, self.gen_len, self.num_slots = int(max_len), int(gen_len), int(num_slots)
        self.max_engines = int(max_engines)
        self.version = 0  # the weights' version (swap)
        #: when set, every request is sampled with this config (a training run's rollout
        #: settings: the behaviour log-probs are then the policy's at the loss's temperature)
        self.forced: SamplingConfig | None = None
        self.engines: dict[SamplingConfig, PagedEngine] = {}
        self._live: dict[tuple[int, int], _Live] = {}  # (engine id, row) -> its job
        self._stepping = False
        self._rng = random.Random()
        self._lock = threading.Lock()
        loop.register("openai.admit", self._admit)
        loop.register("openai.step", self._step)

    def submit(self, job: Job) -> concurrent.futures.Future:
        """Queue ``job``; its future resolves to its samples."""
        if job.prompt_id is None:
            with self._lock:
                job.prompt_id = self._rng.getrandbits(31)
        self.loop.submit("openai.admit", job)
        return job.future

    def swap(self, params, version: int) -> None:
        """Serve new weights from the next decode chunk on (a training run's policy update):
        every engine swaps (:meth:`~jaxrl_llm.sampling.PagedEngine.swap`; rows in flight
        continue, their new tokens record ``version``), on the engine thread, in queue order."""

        def swap() -> None:
            self.params, self.version = params, int(version)
            for eng in self.engines.values():
                eng.swap(params, version)

        self.loop.call(swap).result()

    # ----- the engine thread -------------------------------------------------------------------

    def _engine(self, sampling: SamplingConfig) -> PagedEngine:
        eng = self.engines.get(sampling)
        if eng is not None:
            return eng
        if len(self.engines) >= self.max_engines:
            idle = [s for s, e in self.engines.items() if not e.busy]
            if idle:
                del self.engines[idle[0]]
        kw = self.engine_kw | {"version": self.version}
        eng = PagedEngine(self.params, self.config, sampling=sampling, **kw)
        self.engines[sampling] = eng
        return eng

    def _admit(self, jobs: list[Job]) -> list[Any]:
        out: list[Any] = []
        for job in jobs:
            try:
                eng = self._engine(job.sampling)
                if not eng.busy and len(eng.rows) > 4096:  # an idle engine's records: start anew
                    del self.engines[job.sampling]
                    eng = self._engine(job.sampling)
                assert job.prompt_id is not None
                ids = eng.submit(
                    job.prompt,
                    prompt_id=job.prompt_id,
                    num_samples=job.n,
                    max_new_tokens=job.max_tokens,
                )
            except Exception as e:  # noqa: BLE001 - fails this request only
                job.future.set_exception(e)
                out.append(None)
                continue
            live = _Live(job, eng, ids, len(ids))
            for r in ids:
                self._live[(id(eng), r)] = live
            out.append(None)
        if self._live and not self._stepping:
            self._stepping = True
            self.loop.submit("openai.step", None)
        return out

    def _step(self, items: list[Any]) -> list[None]:
        try:
            for eng in list(self.engines.values()):
                if eng.busy:
                    for r in eng.step():
                        self._ended(eng, r)
                    self._progress(eng)
        except Exception as e:  # noqa: BLE001 - a failed chunk fails the jobs in flight
            for live in {id(v): v for v in self._live.values()}.values():
                if not live.job.future.done():
                    live.job.future.set_exception(e)
            self._live.clear()
            self.engines.clear()
        self._stepping = any(e.busy for e in self.engines.values())
        if self._stepping:
            self.loop.submit("openai.step", None)
        return [None] * len(items)

    def _ended(self, eng: PagedEngine, r: int) -> None:
        live = self._live.pop((id(eng), r), None)
        if live is None:
            return
        live.left -= 1
        if live.left:
            return
        job = live.job
        samples = []
        for i in live.rows:
            row = eng.rows[i]
            samples.append(Sample(list(row.tokens), list(row.logprobs), row.finished, row.versions))
        try:
            if job.top_logprobs:
                temp = 1.0 if job.sampling.greedy else job.sampling.temperature
                tops = top_logprobs(
                    self.params, self.config, job.prompt, [s.tokens for s in samples], temp
                )
                for s, t in zip(samples, tops, strict=True):
                    s.top = [pairs[: job.top_logprobs] for pairs in t]
        except Exception as e:  # noqa: BLE001
            job.future.set_exception(e)
            return
        job.future.set_result(samples)

    def _progress(self, eng: PagedEngine) -> None:
        """Each streaming job's unfinished samples: their tokens so far (read from the slots)."""
        want = [
            (slot, k, r)
            for k, rep in enumerate(eng.replicas)
            for slot, r in enumerate(rep.slot_row)
            if r is not None
            and (live := self._live.get((id(eng), r))) is not None
            and live.job.on_progress is not None
        ]
        if not want:
            return
        gen, tokens, logprobs = jax.device_get(
            (eng.state.gen, eng.state.tokens, eng.state.logprobs)
        )
        for slot, k, r in want:
            live = self._live[(id(eng), r)]
            g = int(gen[k, slot])
            assert live.job.on_progress is not None
            live.job.on_progress(
                live.rows.index(r), tokens[k, slot, :g].tolist(), logprobs[k, slot, :g].tolist()
            )
