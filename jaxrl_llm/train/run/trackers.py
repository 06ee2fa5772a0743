"""Experiment trackers that mirror ``metrics.jsonl``: TensorBoard, Weights & Biases, MLflow.

:class:`~jaxrl_llm.train.run.logging.MetricsLogger` hands every row it writes to each open
tracker (``log(step, row)``: the keys and values of the JSON line that the step produced,
``step`` as the tracker's step; not the ``null`` padding of keys the step did not produce) and
closes them when the run ends, also when it stops (Ctrl-C, an error), saying how it ended. A
NaN or ±Inf, ``null`` in the line, goes as each tracker's API allows: TensorBoard and MLflow
skip it (they take numbers only), W&B logs it as null.

- ``tensorboard``: event files under ``output_dir/tb`` (``tensorboardX``).
- ``wandb``: project ``logging.project`` (or ``logging.wandb_project``), run name
  ``logging.run_name``; W&B's own environment variables apply (``WANDB_MODE=offline`` writes
  the run locally for ``wandb sync``; ``WANDB_DIR`` places its files, else ``output_dir``).
  The config goes in as the run's config.
- ``mlflow``: experiment ``logging.project``, run name ``logging.run_name``, at MLflow's
  tracking URI (``MLFLOW_TRACKING_URI``: a server, ``databricks``, or a local store). The
  config goes in as parameters (dotted keys, ``optim.lr``) and as the artifact
  ``config.yaml``. MLflow refuses some characters in metric names: each becomes ``_``
  (``eval/pass@4`` -> ``eval/pass_4``).

A resumed run (``resume=true``) continues the same W&B and MLflow runs: their ids are kept in
``output_dir/trackers.json``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from jaxrl_llm.errors import TrainingError
from jaxrl_llm.train.config.sections import TRACKER_PACKAGES, missing_package

#: how a run ended, as :meth:`Tracker.close` is told
EndStatus = Literal["finished", "stopped", "failed"]

_IDS_FILE = "trackers.json"


class Tracker(Protocol):
    """What :class:`~jaxrl_llm.train.run.logging.MetricsLogger` needs of a tracker."""

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Record one ``metrics.jsonl`` row (``step`` excluded) at ``step``."""

    def close(self, status: EndStatus) -> None:
        """Flush and end the tracker's run, saying how the training run ended."""


def _numbers(row: Mapping[str, Any]):
    """(key, value) for the real numbers of a row (no bools, nulls, lists or strings)."""
    for k, v in row.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            yield k, v


class TensorBoardTracker:
    """TensorBoard event files under ``run_dir/tb``; ``purge_step`` hides the events a killed
    run wrote at steps >= it (they are logged again by the resumed run)."""

    def __init__(self, run_dir: str, *, purge_step: int | None = None):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(os.path.join(run_dir, "tb"), purge_step=purge_step)

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Add each number of ``row`` as a scalar at ``step``."""
        for k, v in _numbers(row):
            self._writer.add_scalar(k, v, step)

    def close(self, status: EndStatus) -> None:
        """Flush and close the event file."""
        del status
        self._writer.close()


class WandbTracker:
    """A Weights & Biases run (``wandb.init``; ``WANDB_MODE`` / ``WANDB_DIR`` apply)."""

    def __init__(
        self,
        run_dir: str,
        *,
        project: str,
        run_name: str,
        config: Mapping[str, Any],
        run_id: str | None = None,
    ):
        import wandb

        self._run = wandb.init(
            project=project,
            name=run_name,
            dir=os.environ.get("WANDB_DIR") or run_dir,  # read now: wandb caches its setup
            config=dict(config),
            id=run_id,
            resume="allow" if run_id else None,
        )
        self.run_id: str = self._run.id

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Log ``row`` at ``step`` (nulls as null)."""
        self._run.log(dict(row), step=int(step))

    def close(self, status: EndStatus) -> None:
        """Finish the run, with exit code 1 unless it finished."""
        self._run.finish(exit_code=0 if status == "finished" else 1)


_MLFLOW_BAD_CHARS = re.compile(r"[^\w/.\- :]")
_MLFLOW_BATCH = 100  # MLflow's limit of params / metrics per log_batch call is 100 / 1000
_MLFLOW_PARAM_CHARS = 500  # the smallest param value limit among MLflow versions


def mlflow_key(key: str) -> str:
    """``key`` with each character MLflow refuses in a metric or param name replaced by
    ``_`` (``eval/pass@4`` -> ``eval/pass_4``)."""
    return _MLFLOW_BAD_CHARS.sub("_", key)


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: dotted keys, string values (at most 500 chars)."""
    out: dict[str, str] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flat_params(v, key + "."))
        else:
            out[mlflow_key(key)] = str(v)[:_MLFLOW_PARAM_CHARS]
    return out


class MlflowTracker:
    """An MLflow run in experiment ``project`` at MLflow's tracking URI (``MlflowClient``,
    so no global active run is touched)."""

    _STATUS = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}

    def __init__(
        self,
        *,
        project: str,
        run_name: str,
        config: Mapping[str, Any],
        run_id: str | None = None,
    ):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = client = MlflowClient()
        if run_id is not None:  # resumed: the same run, its params logged already
            client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            return
        exp = client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(project)
        self.run_id = client.create_run(exp_id, run_name=run_name).info.run_id
        params = [Param(k, v) for k, v in flat_params(config).items()]
        for i in range(0, len(params), _MLFLOW_BATCH):
            client.log_batch(self.run_id, params=params[i : i + _MLFLOW_BATCH])
        client.log_dict(self.run_id, dict(config), "config.yaml")

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Log each number of ``row`` as a metric at ``step`` (one batch call)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), float(v), now, int(step)) for k, v in _numbers(row)]
        for i in range(0, len(metrics), 1000):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self, status: EndStatus) -> None:
        """End the run as FINISHED, KILLED (stopped) or FAILED."""
        self._client.set_terminated(self.run_id, self._STATUS[status])


def open_trackers(
    names: Sequence[str],
    run_dir: str,
    *,
    project: str,
    run_name: str,
    config: Mapping[str, Any],
    resume: bool = False,
    resume_step: int | None = None,
    optional: Sequence[str] = (),
    note=None,
) -> list[Tracker]:
    """Open the trackers ``names`` for the run in ``run_dir``.

    A tracker in ``optional`` whose package is missing is skipped with a ``note`` (a callable
    taking one line); any other missing package raises ImportError (the config check,
    :func:`jaxrl_llm.train.config.preflight.check_trackers`, refuses such a config before a
    run starts). With ``resume``, W&B and MLflow continue the runs whose ids a previous run
    left in ``run_dir/trackers.json``, and TensorBoard purges the events of steps after
    ``resume_step``.
    """
    ids: dict[str, str] = {}
    ids_path = os.path.join(run_dir, _IDS_FILE)
    if resume and os.path.isfile(ids_path):
        with open(ids_path, encoding="utf-8") as f:
            ids = dict(json.load(f))
    out: list[Tracker] = []
    try:
        _open_each(
            names, run_dir, project, run_name, config, resume, resume_step, optional, note, ids, out
        )
    except BaseException:
        for t in out:  # the ones opened before the failure
            t.close("failed")
        raise
    if ids:
        with open(ids_path, "w", encoding="utf-8") as f:
            json.dump(ids, f)
    return out


def _open_each(
    names, run_dir, project, run_name, config, resume, resume_step, optional, note, ids, out
) -> None:
    for name in names:
        if name not in TRACKER_PACKAGES:
            raise ValueError(f"unknown tracker {name!r}; expected one of {list(TRACKER_PACKAGES)}")
        pip_name = missing_package(name)
        if pip_name is not None:
            if name in optional:
                if note is not None:
                    note(f"note: {pip_name} not installed; skipping {name}")
                continue
            raise ImportError(f"logging.trackers: {name} needs `pip install {pip_name}`")
        try:
            if name == "tensorboard":
                purge = resume_step + 1 if resume and resume_step is not None else None
                out.append(TensorBoardTracker(run_dir, purge_step=purge))
            elif name == "wandb":
                wb = WandbTracker(
                    run_dir, project=project, run_name=run_name, config=config, run_id=ids.get(name)
                )
                ids[name] = wb.run_id
                out.append(wb)
            else:
                ml = MlflowTracker(
                    project=project, run_name=run_name, config=config, run_id=ids.get(name)
                )
                ids[name] = ml.run_id
                out.append(ml)
        except Exception as e:  # noqa: BLE001 - each tracker's own errors: one line
            raise TrackerError(name, e) from None


#: What to check when a tracker cannot start, by tracker.
_START_HINTS = {
    "tensorboard": "check that output_dir/tb can be written",
    "wandb": "log in (wandb login, or WANDB_API_KEY), or set WANDB_MODE=offline",
    "mlflow": "check MLFLOW_TRACKING_URI (a server that answers, or a store it can write)",
}


class TrackerError(TrainingError):
    """A tracker failed to start: one line naming it, its error and what to check."""

    def __init__(self, name: str, error: BaseException):
        first = (str(error).strip().splitlines() or [""])[0][:200]
        super().__init__(
            f"logging.trackers: {name} could not start ({type(error).__name__}"
            + (f": {first}" if first else "")
            + f"); {_START_HINTS.get(name, 'check its settings')}, or remove it from "
            f"logging.trackers"
        )
