"""Asynchronous rollouts within a staleness bound (``rollout.max_staleness: k``, k ≥ 1).

A colocated, single-process form of the one-step-off / bounded-staleness pipelines of the
asynchronous RL trainers (AReaL's ``max_head_offpolicyness``, Fu et al. 2025,
https://arxiv.org/abs/2505.24298; verl's one-step-off; TRL's ``max_staleness``): one
background thread generates and scores the rollouts of the next steps while the learner
updates on this one. JAX releases the GIL while it computes, so generation and the update
overlap as far as the hardware lets them (on a 2-core CPU they compete for the cores; where
a step waits on something else, such as a remote reward, the overlap pays).

Versions. The learner publishes a snapshot of its weights after every step
(:class:`WeightBox`); a rollout samples with the newest snapshot when it starts, and each
row records its version (the optimizer step, ``Experience.policy_version``). Staleness is
counted in train steps (one published snapshot per step; ``epochs × minibatches`` optimizer
steps each). The rollout of step j is submitted during step j − k, when the newest snapshot
is at most k steps older than the one that will train on it, so with ``staleness: wait`` no
batch is ever older than k: the learner waits for the batch when it is not ready
(``async/wait_s``). With ``staleness: drop`` the producer may run one batch further ahead;
a batch that arrives older than k steps is dropped by the
:class:`~jaxrl_llm.train.online.experience.ExperienceBuffer` (``async/dropped``; its prompts are
not trained on) and the learner takes the next one.

Partial rollouts (``rollout.partial``, paged engine). A generation running when the learner
publishes continues with the new weights from its next chunk (:meth:`PagedEngine.swap`): each
token keeps the version that drew it (``Experience.token_version``), a row counts as old as
its oldest token, and the loss weights every token by its own behaviour log-prob
(``async/partial_frac``: rows whose tokens span versions; ``async/token_staleness_mean``).

Rewards. Without dynamic sampling and environments, a batch is scored on a reward thread
(:meth:`Rollouts.collect_deferred`): the rollout thread samples the next batch meanwhile, so
a slow reward (a remote scorer, a sandbox) overlaps with generation as well as with the
update. Reward functions must then be safe to call from several threads at once.

Data position. The producer draws prompts ahead of the learner; the position a checkpoint
records (:class:`ConsumedPosition`) is the one after the last batch the learner took, so a
resumed run draws the batches that were in flight again (sampled with the resumed weights):
no prompt is lost or trained on twice, and the staleness bound holds from the resumed step.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from jaxrl_llm.rewards.user_code import STOPPING
from jaxrl_llm.train.online.experience import Experience, ExperienceBuffer
from jaxrl_llm.train.online.rollout import Rollouts


class WeightBox:
    """The newest published ``(params, version)`` snapshot, read and written atomically."""

    def __init__(self, params: Any, version: int):
        self._lock = threading.Lock()
        self._value = (params, version)

    def publish(self, params: Any, version: int) -> None:
        """Replace the snapshot (the learner, after an update)."""
        with self._lock:
            self._value = (params, version)

    def get(self) -> tuple[Any, int]:
        """The newest ``(params, version)`` (the sampler, when a rollout starts)."""
        with self._lock:
            return self._value


class ConsumedPosition:
    """What a checkpoint records as the data position: the iterator state after the last
    batch the learner took (the producer's own iterator is ahead)."""

    def __init__(self, state: dict, steps_per_epoch: int):
        self._state, self.steps_per_epoch = dict(state), steps_per_epoch

    def state(self) -> dict:
        """The data position to resume from."""
        return dict(self._state)


class Producer:
    """The background rollout thread and the bounded queue of its jobs.

    Args:
      rollouts: a :class:`Rollouts` whose ``weights_fn`` reads ``box``.
      iterator: the prompt iterator (only this thread draws from it).
      box: the learner's published weights.
      max_staleness: k ≥ 1, in train steps. updates_per_step: optimizer steps per train step.
      staleness: ``wait`` (never produce a batch that could be too old) or ``drop`` (produce
        one more batch ahead; drop the ones that arrive too old).
      first_step: the step of the first rollout (after a resume, the resumed step + 1).
      last_step: no rollout is produced past this step (``max_steps``).
    """

    def __init__(
        self,
        rollouts: Rollouts,
        iterator: Any,
        box: WeightBox,
        *,
        max_staleness: int,
        updates_per_step: int,
        staleness: Literal["wait", "drop"],
        first_step: int,
        last_step: int,
    ):
        self.rollouts, self.iterator, self.box = rollouts, iterator, box
        self.k, self.updates = max_staleness, updates_per_step
        self.depth = max_staleness + (1 if staleness == "drop" else 0)
        self.buffer = ExperienceBuffer(max_staleness=max_staleness * updates_per_step)
        self.next_job, self.last_step = first_step, last_step
        self.extra_jobs = 0  # jobs submitted to replace dropped batches
        self.pending: collections.deque[Future] = collections.deque()
        self.position = ConsumedPosition(iterator.state(), iterator.steps_per_epoch)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout")
        # rewards off the sampling thread: the next batch samples while this one scores
        self._scorers = (
            ThreadPoolExecutor(max_workers=self.depth + 1, thread_name_prefix="reward")
            if rollouts.can_defer_scoring
            else None
        )

    def _job(self, job: int) -> tuple[Any, dict, dict, float]:
        t = time.perf_counter()
        if self._scorers is not None:
            score, info = self.rollouts.collect_deferred(self.iterator, job)
            return self._scorers.submit(_scored, score, t), info, self.iterator.state(), 0.0
        exp, info = self.rollouts.collect(self.iterator, job)
        return exp, info, self.iterator.state(), time.perf_counter() - t

    def _fill(self, step: int) -> None:
        """Submit jobs so that those of steps up to ``step + depth`` are queued (fewer past
        ``last_step``; after drops, replacements count against the same bound)."""
        while self.next_job - self.extra_jobs <= min(step + self.depth, self.last_step):
            self.pending.append(self._pool.submit(self._job, self.next_job))
            self.next_job += 1

    def next_batch(self, step: int, version: int) -> tuple[Experience, dict]:
        """The experience the learner at ``version`` (optimizer step) trains on at ``step``,
        and the step's rollout / asynchrony metrics."""
        wait = 0.0
        dropped0 = self.buffer.dropped
        while True:
            self._fill(step)
            t = time.perf_counter()
            exp, info, position, gen_s = self.pending.popleft().result()
            if isinstance(exp, Future):  # scored on a reward thread
                exp, gen_s = exp.result()
            wait += time.perf_counter() - t
            self.buffer.put(exp)
            got = self.buffer.get(version)
            if got is not None:
                break
            self.extra_jobs += 1  # the dropped batch's step needs another rollout
        self.position = ConsumedPosition(position, self.iterator.steps_per_epoch)
        stale = (version - np.asarray(got.policy_version)) // self.updates
        out = {
            **info,
            "time/rollout_s": gen_s,
            "async/wait_s": wait,
            "async/dropped": self.buffer.dropped - dropped0,
            "async/dropped_total": self.buffer.dropped,
            "async/staleness_mean": float(stale.mean()),
            "async/staleness_max": int(stale.max()),
        }
        for i in range(self.k + 1):  # the histogram: share of rows i steps old
            out[f"async/staleness_{i}"] = float(np.mean(stale == i))
        if got.token_version is not None:  # rollout.partial: weights changed mid-generation
            tv = np.asarray(got.token_version)
            sampled = tv >= 0
            newest = np.where(sampled, tv, -1).max(axis=1)
            out["async/partial_frac"] = float(np.mean(newest > np.asarray(got.policy_version)))
            out["async/token_staleness_mean"] = float(
                ((version - tv[sampled]) // self.updates).mean() if sampled.any() else 0.0
            )
        return got, out

    def close(self) -> None:
        """Cancel the queued jobs and wait for the running ones; a run stopping on a signal
        (user calls refused, :data:`~jaxrl_llm.rewards.user_code.STOPPING`) does not wait:
        its running job ends on its own within seconds, its user calls answered at once."""
        for f in self.pending:
            f.cancel()
        self.pending.clear()
        wait = not STOPPING.is_set()
        self._pool.shutdown(wait=wait, cancel_futures=True)
        if self._scorers is not None:
            self._scorers.shutdown(wait=wait, cancel_futures=True)


def _scored(score: Any, t0: float) -> tuple[Experience, float]:
    """Run ``score()`` (the reward functions); the experience and the seconds since its
    rollout began at ``t0`` (sampling + waiting for a reward thread + scoring)."""
    exp = score()
    return exp, time.perf_counter() - t0


def snapshot(policy: Any, sampler: Any) -> tuple[Any, int]:
    """The policy's sampling weights and version as a snapshot the next update cannot
    overwrite: the sampler's copy (:class:`~jaxrl_llm.parallel.sampler_copy.SamplerCopy`, made
    here, on the learner's thread, with the other processes: the sampling thread then issues
    no cross-process computation). The train step donates its state's buffers, so where the
    copy would be the learner's own arrays (full fine-tuning on one layout) they are copied;
    LoRA's merge already makes new arrays."""
    params = sampler(policy.full_params(), copy=policy.lora is None)
    return params, int(policy.state.step)
