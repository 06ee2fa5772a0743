"""What every trainer does around its step, written once: resume, the step loop with its
cadences (evaluation, logging, the non-finite guard, checkpoints), the final save, evaluation
and export.

A trainer subclasses :class:`RunLoop` and provides ``train_step(step) -> metrics``,
``evaluate() -> metrics`` and ``make_iterator(state)``; the offline trainer
(:mod:`jaxrl_llm.train.offline.trainer`) and the online one (:mod:`jaxrl_llm.train.online.trainer`) do.

Resuming (``resume=true``, or ``resume=auto``: the same where a complete checkpoint exists, a
fresh start, said in one line, where none does; a step still being written is never complete)
restores the train state (and its companions, PPO's critic), the
data position and the run's counters from the newest finalised checkpoint; seeds are functions
of (seed, step), so a run killed at any moment and resumed logs the same metrics and ends with
the same parameters as one that was never interrupted (``tests/train/test_kill_resume.py``).

Stopping: Ctrl-C or SIGTERM inside a step (:mod:`jaxrl_llm.train.run.signals`), or user code
failing with ``on_error: raise``, saves the last finished step on every process
(:meth:`RunLoop.save_on_stop`: unless it is on disk already, or the stop landed inside an
update) and ends the run with :class:`~jaxrl_llm.train.run.signals.RunStopped` (or the user code's
one-line error); a run resumed from that checkpoint continues as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

import jax

from jaxrl_llm.errors import ConfigError, TrainingError
from jaxrl_llm.rewards.user_code import UserCodeStop
from jaxrl_llm.train.config.plan import RunPlan
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.programs.policy import Policy, export_policy
from jaxrl_llm.train.run import paths
from jaxrl_llm.train.run.faults import fault_point
from jaxrl_llm.train.run.progress import phase
from jaxrl_llm.train.run.run_state import (
    NonFiniteGuard,
    check_same_data,
    data_digest,
    make_logger,
    output_dir_lock,
    record_config,
    restore_latest,
    run_extra,
)
from jaxrl_llm.train.run.signals import (
    Interrupted,
    RunStopped,
    deferred,
    pending_stop,
    stop_held,
    stop_signals,
    synced_stops,
)


class RunLoop:
    """The run loop shared by the trainers (see the module docstring).

    Subclasses set ``cfg``, ``plan`` (the :class:`~jaxrl_llm.train.config.plan.RunPlan`),
    ``policy``, ``ckpt`` (CheckpointManager), ``guard``
    (NonFiniteGuard), ``iterator``, ``eval_data`` and ``companions`` (``[(checkpointer,
    policy)]`` saved before and restored with the policy) in ``__init__``.
    """

    cfg: RunConfig
    plan: RunPlan
    policy: Policy
    ckpt: Any  # CheckpointManager
    guard: NonFiniteGuard
    iterator: Any
    eval_data: Any  # the held-out split, or None
    progress_keys: tuple[str, ...] = ("loss",)
    eval_every: int = 0
    eval_before: bool = True

    def __init__(self, cfg: RunConfig, *, log_stream=None):
        fault_point("start", 0)  # a trainer's start-up begins: nothing is loaded yet
        self.cfg = cfg
        self.log_stream = log_stream or sys.stderr
        self.companions: list[tuple[Any, Policy]] = []
        self.start_step = 0
        self.resumed: dict | None = None  # the extra of the checkpoint resumed from
        self.train_time = 0.0
        self.logger = None
        self._last_saved: int | None = None
        self._stop_point: tuple[int, dict, list[int]] | None = None  # see _boundary
        self.data_sha256: str | None = None  # the training rows' digest, saved with each step

    # ----- provided by the trainer --------------------------------------------------------
    def train_step(self, step: int) -> dict:
        """One optimizer step (or several, online); returns its metrics."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics (``eval/...``); empty without held-out data."""
        raise NotImplementedError

    def make_iterator(self, state: dict | None = None):
        """The training data iterator, at ``state`` (a checkpoint's data position) or fresh."""
        raise NotImplementedError

    def summary_extras(self) -> dict:
        """Trainer-specific entries of the run summary."""
        return {}

    # ----- shared -------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        """One progress line on the run's stream (main process only)."""
        if jax.process_index() == 0:
            print(msg, file=self.log_stream, flush=True)

    def maybe_resume(self) -> None:
        """Restore the newest checkpoint that the policy and every companion hold (a kill can
        land between their writes), the data position and the counters, when ``resume``."""
        if not self.cfg.resume:
            return
        step = None
        if self.companions and self.ckpt.latest_step() is not None:
            both = set(self.ckpt.all_steps())
            for c, _ in self.companions:
                both &= set(c.all_steps())
            if not both:
                raise TrainingError(
                    f"{self.cfg.output_dir}: no step has both a policy and a "
                    f"{'/'.join(os.path.basename(c.directory) for c, _ in self.companions)} "
                    f"checkpoint (policy: {self.ckpt.all_steps()}, others: "
                    f"{[c.all_steps() for c, _ in self.companions]}); start a fresh run or "
                    f"restore one"
                )
            step = self._newest_intact_in_all(both)
            for c, holder in self.companions:
                restore_latest(c, holder, step)
        extra = restore_latest(self.ckpt, self.policy, step)
        if extra is None:
            how = "resume auto" if self.cfg.resume == "auto" else "--resume"
            self.say(f"{how}: no complete checkpoint in {self.ckpt.directory}; starting fresh")
            return
        step = int(extra.get("step", int(self.policy.state.step)))
        check_same_data(self.cfg, extra, self.data_sha256)
        if step > self.cfg.max_steps:
            raise ConfigError(
                f"--resume: the newest checkpoint in {self.cfg.output_dir} is at step {step}, "
                f"past max_steps={self.cfg.max_steps}; set max_steps >= {step} to continue it"
            )
        self.iterator = self.make_iterator(extra.get("data"))
        self.start_step = step
        self._last_saved = self.start_step  # on disk already: saving it again would fail
        self.guard.restore(extra)
        self.train_time = float(extra.get("train_time_s", 0.0))
        self.resumed = extra
        self.say(
            f"resumed from step {self.start_step}"
            + (
                " (resume auto: the newest complete checkpoint)"
                if self.cfg.resume == "auto"
                else ""
            )
        )

    def _newest_intact_in_all(self, steps: set[int]) -> int:
        """The newest of ``steps`` (held by the policy and every companion) whose files look
        intact in each (:func:`~jaxrl_llm.train.run.checkpoint_steps.step_damage`); a damaged one is
        skipped with one line naming it. With none intact, the newest: its restore says why."""
        from jaxrl_llm.train.run.checkpoint import RESTORED_ITEMS
        from jaxrl_llm.train.run.checkpoint_steps import step_damage

        order = sorted(steps, reverse=True)
        for k, s in enumerate(order):
            bad = [
                (c.directory, problem)
                for c in [self.ckpt, *(c for c, _ in self.companions)]
                if (problem := step_damage(os.path.join(c.directory, str(s)), RESTORED_ITEMS))
            ]
            if not bad:
                return s
            if k + 1 < len(order):
                where, problem = bad[0]
                self.say(
                    f"checkpoint {where}: step {s} is unreadable, its files truncated or corrupt "
                    f"({problem}); trying step {order[k + 1]}"
                )
        return order[0]

    def save(self, step: int, *, force: bool = False, data: dict | None = None) -> None:
        """Checkpoint the state (companions first, so a policy step implies theirs), the data
        position (``data``, default the iterator's now) and the run's counters
        (:func:`run_extra`); a step already saved is skipped."""
        if step == self._last_saved:
            return
        self._last_saved = step
        for c, holder in self.companions:
            c.save(step, holder.state, force=force, extra={"step": step})
            if jax.process_count() > 1:
                # Two of orbax's async multi-host saves at once collide on its barrier names
                # ("Barrier ThreadSaveMultiHostValueHolder:set_value_start is already ongoing",
                # seen with PPO's critic under load): the companion's finishes first.
                c.wait_until_finished()
        self.ckpt.save(
            step,
            self.policy.state,
            force=force,
            extra=run_extra(
                step,
                iterator=self.iterator,
                logger=self.logger,
                guard=self.guard,
                train_time_s=self.train_time,
                data=data,
                data_sha256=self.data_sha256,
            ),
        )
        fault_point("checkpoint", step)

    def run(self) -> dict:
        """Train for ``max_steps`` (or from a resumed step); returns the summary dict
        (held-out metrics before / after, timings, the export path)."""
        os.makedirs(paths.log_dir(self.cfg), exist_ok=True)
        os.makedirs(paths.lock_dir(self.cfg), exist_ok=True)
        where = paths.where_words(self.cfg)
        if where is not None:
            self.say(where)
        multi = jax.process_count() > 1
        with output_dir_lock(paths.lock_dir(self.cfg)), stop_signals(), synced_stops(multi):
            self.data_sha256 = data_digest(self.cfg)
            self.maybe_resume()
            record_config(
                self.cfg, self.plan.loss_config, self.start_step if self.resumed else None, self.say
            )
            return self._run()

    def _boundary(self, step: int) -> tuple[int, dict, list[int]]:
        """What a stop inside ``step`` may save: the last finished step, the data position
        after it and the identities of the policy's and its companions' train states then
        (an update replaces the state object, so equal identities mean no update since; no
        device value is read, so the step's asynchronous dispatch is not waited on)."""
        holders = [self.policy] + [h for _, h in self.companions]
        return step - 1, self.iterator.state(), [id(h.state) for h in holders]

    def save_on_stop(self, boundary: tuple[int, dict, list[int]]) -> str:
        """Save the last finished step when a run stops inside the next one (a signal, or user
        code with ``on_error: raise``), unless it is on disk already: no finished step is lost
        (a checkpoint a few steps back once stood in for it, and the steps after it were
        trained again); returns what happened, in words. Nothing is saved when the stop
        landed inside an update (the state is then between two steps)."""
        step, data, counts = boundary
        holders = [self.policy] + [h for _, h in self.companions]
        self.ckpt.wait_until_finished()  # a periodic save the stop cut into, if any
        on_disk = self.ckpt.all_steps()
        last = max(on_disk) if on_disk else None
        if self._last_saved is not None and self._last_saved not in on_disk:
            self._last_saved = None  # its write did not finish: saving it again is allowed
        where = self.ckpt.directory
        if [id(h.state) for h in holders] != counts:  # an update replaced a state
            return (
                f"stopped after the update of step {step + 1} began, so its state is not saved; "
                + (f"the newest checkpoint is step {last}" if last else "no checkpoint was saved")
            )
        if step <= 0:
            return "stopped in the first step; nothing to save"
        if step == last:
            return f"checkpoint of step {step} kept (on disk already in {where})"
        self.save(step, force=True, data=data)
        self.ckpt.wait_until_finished()
        for c, _ in self.companions:
            c.wait_until_finished()
        return f"saved step {step} in {where}"

    def _run(self) -> dict:
        cfg = self.cfg
        self.logger = logger = make_logger(
            cfg,
            progress_keys=self.progress_keys,
            stream=self.log_stream,
            resumed=self.resumed,
            loss_config=self.plan.loss_config,
        )
        try:
            summary = self._steps(logger)
        except (RunStopped, KeyboardInterrupt):
            logger.close("stopped")
            raise
        except BaseException:
            logger.close("failed")
            raise
        logger.close()
        return summary

    def _steps(self, logger) -> dict:
        """The step loop, the final save, evaluation and export; returns the summary."""
        cfg = self.cfg
        summary: dict[str, Any] = {}
        t_start = time.perf_counter()
        first = self.start_step + 1
        if self.eval_before and self.eval_data is not None and self.start_step == 0:
            self._synced_stop(first, starting=True)  # a stop during start-up
            with phase("eval before training", self.say):
                summary["eval_before"] = self.evaluate()
            logger.log(0, summary["eval_before"])
        for step in range(first, cfg.max_steps + 1):
            self._stop_point = self._boundary(step)
            self._synced_stop(step, starting=step == first)
            try:
                self._step(step)
            except Interrupted as e:
                done = self.save_on_stop(self._stop_point)
                raise RunStopped(e.signum, f"step {step}: {done}") from None
            except UserCodeStop as e:
                raise UserCodeStop(f"{e}; {self.save_on_stop(self._stop_point)}") from None
        # Saved before the final evaluation, so that a run resumed from this checkpoint
        # evaluates (and logs) it exactly once.
        self.save(cfg.max_steps, force=True)
        if self.eval_data is not None:
            with phase("eval after training", self.say):
                summary["eval_after"] = self.evaluate()
            logger.log(cfg.max_steps, summary["eval_after"], progress=False)
        self.ckpt.wait_until_finished()
        for c, _ in self.companions:
            c.wait_until_finished()
        if cfg.checkpoint.export_hf:
            # a URI's run directory cannot take transformers' local writes: the export goes to
            # the local log directory then (paths.log_dir)
            local = cfg
            if paths.is_remote(cfg.output_dir):
                local = dataclasses.replace(cfg, output_dir=paths.log_dir(cfg))
            summary["hf_export"] = export_policy(self.policy, local)
        summary.update(self.summary_extras())
        summary.update(
            train_time_s=self.train_time,
            total_time_s=time.perf_counter() - t_start,
            steps=cfg.max_steps,
        )
        return summary

    def _synced_stop(self, step: int, *, starting: bool = False) -> None:
        """A multi-process job's stop, at the boundary before ``step``: when any process has
        received a stop signal since the last boundary (:func:`pending_stop`, gathered from every
        process), every process saves the last finished step (:meth:`save_on_stop`, the same
        on each) and raises RunStopped. ``starting``: the boundary after start-up (model load,
        compile, resume), where no step of this run has finished: nothing is saved. One
        process: nothing (its stop is raised at once)."""
        if jax.process_count() == 1:
            return
        import signal

        import numpy as np
        from jax.experimental import multihost_utils

        from jaxrl_llm.parallel.distributed import preemption_notice

        mine = np.array([pending_stop(), preemption_notice(step)], np.int32)
        flags = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 2)
        signum = int(flags[:, 0].max()) or (signal.SIGTERM if flags[:, 1].any() else 0)
        if not signum:
            return
        who = (
            "process " + ", ".join(str(i) for i, f in enumerate(flags[:, 0]) if f)
            if flags[:, 0].any()
            else "JAX's preemption notice"
        )
        if starting:
            last = self.start_step if self.resumed else None
            raise RunStopped(
                signum,
                f"during start-up, before step {step} (signalled: {who}; all stop here): "
                f"no step finished, nothing to save"
                + (f"; the newest checkpoint is step {last}" if last else ""),
            )
        done = self.save_on_stop(self._boundary(step))
        raise RunStopped(signum, f"step {step} (signalled: {who}; all stop here): {done}")

    def _step(self, step: int) -> None:
        """One step with its cadences: train, evaluate, the non-finite guard, log, save."""
        cfg, logger = self.cfg, self.logger
        assert logger is not None
        t = time.perf_counter()
        metrics = self.train_step(step)
        self.train_time += time.perf_counter() - t
        metrics["time/train_elapsed_s"] = self.train_time
        if self.policy.lr_schedule is not None:  # the lr of the step's last update
            metrics["optim/lr"] = self.policy.learning_rate()
        # (a stop the update held: the step is saved, not evaluated)
        evaluates = self.eval_every and step % self.eval_every == 0 and step < cfg.max_steps
        if evaluates and not stop_held():
            with phase(f"eval at step {step}", self.say):
                metrics.update(self.evaluate())
        with deferred():  # a signal here waits until the step counts as finished
            bad = metrics.get("nonfinite", 0.0)
            metrics.update(self.guard.update(step, bad))
            if step % cfg.logging.log_every == 0 or step == cfg.max_steps or bad:
                logger.log(step, metrics)
            if not self.guard.consecutive:  # finished and logged: a stop from here saves it
                self._stop_point = self._boundary(step + 1)
        if self.guard.consecutive:
            self.guard.check(step)
        elif cfg.checkpoint.save_every and step % cfg.checkpoint.save_every == 0:
            self.save(step)

    def close(self) -> None:
        """Release the checkpoint managers."""
        self.ckpt.close()
        for c, _ in self.companions:
            c.close()
