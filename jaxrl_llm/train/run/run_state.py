"""What a run keeps besides its train state: the checkpointer, the metrics logger, the
non-finite guard, the ``extra`` record a resumed run continues from, the run's config record
and the lock that keeps two runs out of one ``output_dir``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import jax

from jaxrl_llm.errors import ConfigError, TrainingError
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.programs.policy import Policy
from jaxrl_llm.train.run import paths


def make_checkpointer(cfg: RunConfig, policy: Policy, *, subdir: str = "checkpoints"):
    """The run's orbax CheckpointManager under ``output_dir/<subdir>`` (model config and
    tokenizer saved alongside, so ``jaxrl-llm convert`` works from it); ``output_dir`` may be
    a URI (:mod:`jaxrl_llm.train.run.paths`)."""
    from jaxrl_llm.train.run.checkpoint import CheckpointManager

    tok = policy.tokenizer if hasattr(policy.tokenizer, "save_pretrained") else None
    return CheckpointManager(
        paths.join(paths.resolve(cfg.output_dir), subdir),
        save_every=cfg.checkpoint.save_every or 10**9,
        keep=cfg.checkpoint.keep,
        model_config=policy.config,
        tokenizer=tok,
    )


def restore_latest(ckpt, policy: Policy, step: int | None = None) -> dict | None:
    """Restore the newest finalised checkpoint (or ``step``) into ``policy.state`` (same
    shardings); returns its ``extra`` dict, or None when there is no checkpoint."""
    if ckpt.latest_step() is None:
        return None
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), policy.state
    )
    policy.state, extra = ckpt.restore(abstract, step)
    return extra


def make_logger(
    cfg: RunConfig, *, progress_keys, stream, resumed: dict | None, loss_config: Any = None
):
    """The run's MetricsLogger (metrics.jsonl and the trackers of ``logging``, in the local
    :func:`~jaxrl_llm.train.run.paths.log_dir`; main process only). The trackers get the resolved config (:func:`resolved_config_dict`).

    ``resumed`` is the ``extra`` dict of the checkpoint the run resumed from (None for a fresh
    run): its ``metrics_rows`` (see :func:`run_extra`) says how many rows of ``metrics.jsonl``
    to keep, and its ``step`` which TensorBoard events to purge, so rows logged after that
    checkpoint by a killed run are not duplicated.
    """
    from jaxrl_llm.train.run.logging import MetricsLogger

    lg = cfg.logging
    return MetricsLogger(
        paths.log_dir(cfg),
        total_steps=cfg.max_steps,
        trackers=lg.active_trackers(),
        project=lg.project or lg.wandb_project,
        run_name=paths.run_name(cfg),
        is_main_process=jax.process_index() == 0,
        progress_keys=progress_keys,
        stream=stream,
        config=resolved_config_dict(cfg, loss_config),
        resume=resumed is not None,
        keep_rows=None if resumed is None else resumed.get("metrics_rows"),
        resume_step=None if resumed is None else resumed.get("step"),
    )


def resolved_config_dict(cfg: RunConfig, loss_config: Any = None) -> dict:
    """The config as a dict, its loss section as the run plan resolved it (``loss_config``,
    with its defaults; None keeps the config's), without ``resume``."""
    from jaxrl_llm.train.config.config_io import to_dict

    resolved = to_dict(cfg)
    if loss_config is not None:
        resolved["loss"] = to_dict(loss_config)
    resolved.pop("resume", None)
    return resolved


def run_extra(
    step: int,
    *,
    iterator,
    logger,
    guard: NonFiniteGuard,
    train_time_s: float,
    data: dict | None = None,
    data_sha256: str | None = None,
) -> dict:
    """The JSON ``extra`` a trainer saves with each checkpoint: everything besides the train
    state that a resumed run needs to continue exactly as an uninterrupted one (data position:
    ``data``, default ``iterator.state()``; rows of ``metrics.jsonl`` logged so far, the
    non-finite guard's count, training time), and the digest of the training rows
    (:func:`data_digest`) that a resume checks (:func:`check_same_data`)."""
    return {
        "step": int(step),
        "data": iterator.state() if data is None else data,
        "metrics_rows": None if logger is None else logger.rows,
        "nonfinite_steps_total": guard.total,
        "train_time_s": float(train_time_s),
        "data_sha256": data_sha256,
    }


def data_digest(cfg: RunConfig) -> str | None:
    """The SHA-256 of the run's training data file (``data.train``), or None when it is not a
    local file (a hub data set, a saved ``datasets`` directory)."""
    import hashlib

    path = cfg.data.train
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_same_data(cfg: RunConfig, extra: dict, digest: str | None) -> None:
    """Refuse a resume whose training rows differ from those the checkpoint was trained on
    (its data position would index other rows). Checkpoints written before the digest was
    saved, and data that is not a local file, are not checked.

    Raises:
      ConfigError: one line naming the file and the checkpoint.
    """
    saved = extra.get("data_sha256")
    if saved is None or digest is None or saved == digest:
        return
    raise ConfigError(
        f"--resume: data.train {cfg.data.train!r} differs from the rows the checkpoint of step "
        f"{extra.get('step')} in {cfg.output_dir!r} was trained on (sha256 {digest[:12]}, saved "
        f"{saved[:12]}); restore those rows to continue, or train on these in a new run "
        f"(another output_dir, model.source={cfg.output_dir})"
    )


class NonFiniteGuard:
    """Counts consecutive steps whose update the train step skipped (NaN/Inf loss or gradient)
    and stops the run after ``limit`` of them, naming the last good checkpoint.

    A checkpoint of step N holds the weights after update N; the loss of step N + 1 is the
    first computed with them. When the bad steps begin at step B, the checkpoint of step B − 1
    holds the weights that produced them (an update with a finite loss can still blow the
    weights up: ``optim.lr=1e30``), so the last good checkpoint is the newest of step ≤ B − 2.
    """

    def __init__(self, limit: int, ckpt):
        self.limit = max(int(limit), 1)
        self.ckpt = ckpt
        self.consecutive = 0
        self.total = 0
        self.first_bad: int | None = None  # the first step of the current run of bad steps

    def restore(self, extra: dict) -> None:
        """Continue the count of a resumed run (from its checkpoint's :func:`run_extra`);
        periodic checkpoints follow good steps only, so ``consecutive`` restarts at 0."""
        self.total = int(extra.get("nonfinite_steps_total", 0))

    def update(self, step: int, nonfinite: float) -> dict:
        """Record one step's ``nonfinite`` flag; returns the metrics to log."""
        if nonfinite:
            if not self.consecutive:
                self.first_bad = step
            self.consecutive += 1
            self.total += 1
        else:
            self.consecutive = 0
            self.first_bad = None
        return {"nonfinite_steps_total": self.total}

    def check(self, step: int) -> None:
        """Raise TrainingError after ``limit`` bad steps in a row (call after logging)."""
        from jaxrl_llm.errors import TrainingError

        if self.consecutive >= self.limit:
            self.ckpt.wait_until_finished()  # an async save of the last good step may be pending
            steps = self.ckpt.all_steps()
            first_bad = self.first_bad if self.first_bad is not None else step
            good = [s for s in steps if s <= first_bad - 2]
            if good:
                where = f"the last good checkpoint is step {good[-1]} in {self.ckpt.directory}" + (
                    f" (step {steps[-1]} holds the weights that gave the non-finite loss)"
                    if steps[-1] > good[-1]
                    else ""
                )
            elif steps:
                where = (
                    f"no good checkpoint is kept: step(s) {steps} hold the weights that gave "
                    f"the non-finite loss at step {first_bad} (a larger checkpoint.keep keeps "
                    f"older ones)"
                )
            else:
                where = "no checkpoint was written"
            raise TrainingError(
                f"step {step}: {self.consecutive} consecutive steps with a "
                f"non-finite loss or gradient (updates skipped); stopping — "
                f"{where}. Lower optim.lr or check the data and rewards."
            )


_HELD: set[str] = set()  # output_dirs this process holds


@contextlib.contextmanager
def output_dir_lock(output_dir: str):
    """Hold an exclusive lock on ``output_dir`` for a run (main process only): a second run
    started on the same directory stops with a one-line error instead of mixing its
    checkpoints and metrics into the first's. The lock is an ``flock`` on
    ``output_dir/.lock``: released by the OS when the process ends, even when killed. Pass
    :func:`~jaxrl_llm.train.run.paths.lock_dir` (a URI cannot be ``flock``-ed: its local log
    directory is locked instead).
    Re-entrant within a process (``jaxrl-llm train`` takes it before building the trainer,
    whose ``run`` takes it again)."""
    key = os.path.realpath(output_dir)
    if jax.process_index() != 0 or key in _HELD:  # re-entered: the CLI holds it around the run
        yield
        return
    import fcntl

    path = os.path.join(output_dir, ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TrainingError(
                f"output_dir {output_dir!r} is in use by another run (it holds "
                f"{path}); wait for it to end or choose another output_dir"
            ) from None
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
    finally:
        os.close(fd)  # releases the lock


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def record_config(cfg: RunConfig, loss_config: Any, resumed_step: int | None, say) -> None:
    """Write the resolved config (the loss section as the run plan resolved it,
    ``loss_config``, with its defaults) into the run's local
    :func:`~jaxrl_llm.train.run.paths.log_dir` (``output_dir`` unless it is a URI).

    A fresh run writes ``config.yaml``. A resumed one keeps that file (the run's original
    config) and writes ``config.resumed-<step>.yaml`` beside it, after ``say``-ing every key
    whose value changed (``optim.lr: 0.0001 -> 0.0002``). Called once the resume succeeded, so
    a refused resume leaves the directory as it was.
    """
    if jax.process_index() != 0:
        return
    import yaml

    resolved = resolved_config_dict(cfg, loss_config)
    logs = paths.log_dir(cfg)
    os.makedirs(logs, exist_ok=True)
    original = os.path.join(logs, "config.yaml")
    if resumed_step is None or not os.path.isfile(original):
        path = original
    else:
        with open(original, encoding="utf-8") as f:
            before = _flat(yaml.safe_load(f) or {})
        after = _flat(resolved)
        changed = [
            f"{k}: {before.get(k)!r} -> {after.get(k)!r}"
            for k in sorted(set(before) | set(after))
            if k != "resume" and before.get(k) != after.get(k)
        ]
        say(
            f"resume from step {resumed_step}: config changes vs config.yaml: "
            + ("; ".join(changed) if changed else "none")
        )
        path = os.path.join(logs, f"config.resumed-{resumed_step}.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(resolved, f, sort_keys=False)
