"""Run logging: ``metrics.jsonl`` (one JSON object per logged step, with ``step``), the
experiment trackers that mirror it (TensorBoard, Weights & Biases, MLflow:
:mod:`jaxrl_llm.train.run.trackers`), and a progress line with ETA and key metrics.

One key set per run: every line carries every key an earlier line carried (``null`` where this
step did not produce it: ``eval/*`` between evaluations, a feature's keys on steps without it),
and when the run ends (:meth:`MetricsLogger.close`, also on a stop) lines written before a key
first appeared get it as ``null`` too, so every line of a finished run has the same keys.

Only process 0 writes (multi-host runs never clobber each other's files); other processes get
a logger whose methods do nothing, so callers never branch on the process index.

Resuming: a trainer stores :attr:`MetricsLogger.rows` (rows logged so far) in each checkpoint
and passes it back as ``keep_rows`` when it resumes from that checkpoint, so the rows a killed
run logged after its last checkpoint (which the resumed run logs again) are dropped, and
``metrics.jsonl`` holds each step once. The file is rewritten atomically (temporary file +
``os.replace``), so a kill during the rewrite leaves either the old or the new file. Of those
``keep_rows`` rows, the ones a damaged file no longer holds intact (cut short, a corrupt line,
bytes that are not UTF-8) are left out, and one line on the logger's stream names them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.train.run.trackers import EndStatus, Tracker, open_trackers


def _finite(x: Any) -> Any:
    """``x`` with every non-finite float (at any depth of lists) replaced by None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, list):
        return [_finite(y) for y in x]
    return x


def _to_python(v: Any):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    try:
        arr = np.asarray(v)
    except Exception:  # noqa: BLE001 - non-array values (strings) are logged as they are
        return v
    if arr.dtype.kind in "fiu" and arr.size == 1:
        return _finite(arr.item())
    if arr.dtype.kind in "fiu":
        return _finite(arr.tolist())
    return _finite(v) if isinstance(v, float | list) else v


def _count_nonfinite(v: Any) -> int:
    try:
        arr = np.asarray(v)
    except Exception:  # noqa: BLE001 - not numeric
        return 0
    if arr.dtype.kind != "f":
        return 0
    return int(np.size(arr) - np.isfinite(arr).sum())


def scalarize(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Device arrays / numpy scalars -> plain Python numbers for strict JSON: NaN and ±Inf
    become None (null), so every line of ``metrics.jsonl`` is strict JSON (RFC 8259 has no
    NaN / Infinity; Python's ``json`` writes them unless ``allow_nan=False``)."""
    return {k: _to_python(v) for k, v in metrics.items()}


def nonfinite_count(metrics: Mapping[str, Any]) -> int:
    """How many float values of ``metrics`` are NaN or ±Inf (logged as null)."""
    return sum(_count_nonfinite(v) for v in metrics.values() if not isinstance(v, str | bytes))


class MetricsLogger:
    """Writes metrics for one run directory.

    Args:
      run_dir: where ``metrics.jsonl`` and ``tb/`` live (created if needed).
      total_steps: for the progress line's ETA.
      trackers: the trackers to mirror rows to (``tensorboard``, ``wandb``, ``mlflow``;
        :mod:`jaxrl_llm.train.run.trackers`); None: ``tensorboard`` when ``tensorboard`` (and
        then skipped with a note when ``tensorboardX`` is missing), ``wandb`` when
        ``wandb_project``.
      tensorboard: with ``trackers`` None, write TensorBoard events.
      wandb_project: with ``trackers`` None, log to this Weights & Biases project as well.
      project, run_name: the W&B project / MLflow experiment and the run's name there
        (defaults: ``wandb_project`` or ``jaxrl_llm``; the name of ``run_dir``).
      config: the run's resolved config, given to W&B as its config and MLflow as params.
      is_main_process: only the main process writes; others are no-ops.
      progress_keys: metric names shown on the progress line.
      stream: where progress lines go (stderr by default, so stdout stays clean).
      resume: append to an existing ``metrics.jsonl`` (else it is started afresh).
      keep_rows: with ``resume``, keep only the first ``keep_rows`` rows of the existing file
        (the rows logged up to the checkpoint being resumed, :attr:`rows` at that save);
        None keeps every complete row. A torn last line (a killed write) is always dropped.
      resume_step: with ``resume``, the step of the checkpoint being resumed: TensorBoard
        events of later steps (logged by the killed run, logged again now) are purged
        (tensorboardX's ``purge_step``), so curves carry one point per step.

    Attributes:
      rows: rows in ``metrics.jsonl`` so far (kept + logged); store it with a checkpoint.
    """

    def __init__(
        self,
        run_dir: str,
        *,
        total_steps: int | None = None,
        trackers: Sequence[str] | None = None,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        project: str | None = None,
        run_name: str | None = None,
        is_main_process: bool = True,
        progress_keys: tuple[str, ...] = ("loss",),
        stream=None,
        config: dict | None = None,
        resume: bool = False,
        keep_rows: int | None = None,
        resume_step: int | None = None,
    ):
        self.enabled = is_main_process
        self.rows = int(keep_rows or 0) if resume else 0
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.progress_keys = progress_keys
        self.stream = stream or sys.stderr
        self._t0 = time.perf_counter()
        self._first_step: int | None = None
        self.trackers: list[Tracker] = []
        self._file = None
        self._keys: dict[str, None] = {}  # every key logged so far (not ``step``), in order
        self._ragged = False  # some line of the file lacks a key of ``_keys``
        if not self.enabled:
            return
        os.makedirs(run_dir, exist_ok=True)
        self.path = path = os.path.join(run_dir, "metrics.jsonl")
        if resume:
            kept, gap = _truncate_rows(path, keep_rows)
            if gap:
                print(gap, file=self.stream, flush=True)
            for row in kept:
                self._keys.update(dict.fromkeys(k for k in row if k != "step"))
            self._ragged = any(len(row) != len(self._keys) + 1 for row in kept)
            self.rows = len(kept)
        # held open for the run's lifetime; close() closes it
        self._file = open(path, "a" if resume else "w", encoding="utf-8")  # noqa: SIM115
        optional: tuple[str, ...] = ()
        if trackers is None:
            trackers = (["tensorboard"] if tensorboard else []) + (
                ["wandb"] if wandb_project else []
            )
            optional = ("tensorboard",)
        self.trackers = open_trackers(
            trackers,
            run_dir,
            project=project or wandb_project or "jaxrl_llm",
            run_name=run_name or os.path.basename(os.path.normpath(os.path.abspath(run_dir))),
            config=config or {},
            resume=resume,
            resume_step=resume_step,
            optional=optional,
            note=lambda line: print(line, file=self.stream),
        )

    def _add_keys(self, row: Mapping[str, Any]) -> None:
        """Extend the key set by ``row``'s keys; lines already written lack the new ones."""
        new = [k for k in row if k != "step" and k not in self._keys]
        if new and self.rows > 0:
            self._ragged = True
        self._keys.update(dict.fromkeys(new))

    def log(self, step: int, metrics: Mapping[str, Any], *, progress: bool = True) -> dict:
        """Append one JSON line ``{"step": step, **metrics}``, with ``null`` for each key an
        earlier line had that ``metrics`` lacks, and mirror it to the trackers (the keys of
        ``metrics`` only: a W&B row logged twice at one step, as the final evaluation is, is
        merged, and padding nulls would erase the first row's values)."""
        new = {"step": int(step), **scalarize(metrics)}
        bad = nonfinite_count(metrics)
        if bad:
            new["log/nonfinite_values"] = bad  # logged as null
        if not self.enabled:
            self.rows += 1
            return new
        assert self._file is not None  # enabled implies an open file
        self._add_keys(new)
        row = {"step": new["step"], **{k: new.get(k) for k in self._keys}}
        self.rows += 1
        self._file.write(json.dumps(row, allow_nan=False, default=repr) + "\n")
        self._file.flush()
        own = {k: v for k, v in new.items() if k != "step"}  # not the padding nulls
        for tracker in self.trackers:
            tracker.log(int(step), own)
        if progress:
            self.print_progress(step, row)
        return row

    def print_progress(self, step: int, row: Mapping[str, Any]) -> None:
        """One line: step/total, elapsed, ETA, tokens/s and the progress keys."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._first_step is None:
            self._first_step, self._t0 = step, now
        done = step - self._first_step
        elapsed = now - self._t0
        parts = [f"step {step}" + (f"/{self.total_steps}" if self.total_steps else "")]
        if self.total_steps and done > 0:
            eta = elapsed / done * max(self.total_steps - step, 0)
            parts.append(f"eta {_fmt_time(eta)}")
        for k in self.progress_keys:
            v = row.get(k)
            if isinstance(v, float):
                parts.append(f"{k} {v:.4g}")
            elif v is not None:
                parts.append(f"{k} {v}")
        print(" | ".join(parts), file=self.stream, flush=True)

    def close(self, status: EndStatus = "finished") -> None:
        """Close every sink; lines written before a key first appeared get it as ``null``
        (an atomic rewrite), so every line has the run's key set. ``status`` (``finished``,
        ``stopped``: Ctrl-C / SIGTERM, ``failed``) is what the trackers record. A second
        call does nothing."""
        if self._file is not None:
            self._file.close()
            self._file = None
            if self._ragged:
                rows = [json.loads(line) for line in _complete_lines(self.path)]
                _write_lines(self.path, [self._line(r) for r in rows])
                self._ragged = False
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close(status)

    def _line(self, row: Mapping[str, Any]) -> str:
        full = {"step": row.get("step"), **{k: row.get(k) for k in self._keys}}
        return json.dumps(full, allow_nan=False, default=repr)


def _complete_lines(path: str) -> list[str]:
    """The lines of ``path`` that are whole JSON objects (a torn last line is left out)."""
    with open(path, encoding="utf-8") as f:
        return [line for line in f.read().split("\n") if _is_row(line)]


def _write_lines(path: str, lines: list[str]) -> None:
    """Replace ``path`` with ``lines`` atomically (temporary file + ``os.replace``)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _truncate_rows(path: str, keep: int | None) -> tuple[list[dict], str | None]:
    """Atomically rewrite ``path`` with the intact rows among its first ``keep`` lines (the
    rows the checkpoint counted; None: every line, a torn last one left out); returns the rows
    kept and, when some of those ``keep`` rows are missing (a truncated file) or damaged (not
    a JSON object, bytes that are not UTF-8), one line that says which. A missing file counts
    as empty."""
    if not os.path.isfile(path):
        return [], None if not keep else _gap_note(path, keep, list(range(1, keep + 1)))
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last row
    if keep is None:
        if lines and not _is_row(lines[-1]):
            lines.pop()  # a torn last line: a killed write, not damage
        counted = len(lines)
    else:
        counted, lines = keep, lines[:keep]
    lost = [i + 1 for i, line in enumerate(lines) if not _is_row(line)]
    lost += list(range(len(lines) + 1, counted + 1))  # rows the file no longer holds
    kept = [line for line in lines if _is_row(line)]
    _write_lines(path, kept)
    return [json.loads(line) for line in kept], _gap_note(path, counted, lost) if lost else None


def _gap_note(path: str, counted: int, lost: list[int]) -> str:
    """One line naming the rows of ``path`` that a resume could not keep."""
    spans, start = [], lost[0]
    for i, a in enumerate(lost):
        if i + 1 == len(lost) or lost[i + 1] != a + 1:
            spans.append(f"{start}" if start == a else f"{start}-{a}")
            start = lost[i + 1] if i + 1 < len(lost) else a
    return (
        f"{path}: {len(lost)} of the {counted} rows logged up to the checkpoint are missing or "
        f"damaged (rows {', '.join(spans)}); rewritten from the {counted - len(lost)} intact "
        f"rows, so the metrics of those rows are a gap"
    )


def _is_row(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def _fmt_time(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def read_metrics(run_dir: str) -> list[dict]:
    """Read ``metrics.jsonl`` of a run directory (skips a torn last line from a killed run)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def samples_file(process_index: int) -> str:
    """The name of the samples file process ``process_index`` writes: ``samples.jsonl`` for
    process 0 (every single-process run), ``samples.process-<k>.jsonl`` for process k."""
    return "samples.jsonl" if not process_index else f"samples.process-{process_index}.jsonl"


class SamplesLog:
    """``samples.jsonl``: the episodes of every ``every``-th step, one JSON line each
    (``{"step", "prompt_id", "sample", "messages", "reward"}``), for reading what the policy
    does. Resumed at ``resume_step``, lines of later steps (the killed run's, sampled again now)
    are dropped first (atomic rewrite); a fresh run (``resume_step`` None) starts the file
    afresh, as ``metrics.jsonl`` does, so a run killed before its first checkpoint and started
    again does not log its first steps twice.

    Across processes (host-local rows) each process writes the rows it sampled, in its own
    log directory: process 0 ``samples.jsonl``, process k ``samples.process-k.jsonl``
    (:func:`samples_file`); no row crosses hosts. On a shared log directory the files lie
    side by side; together they are the step's episodes."""

    def __init__(
        self, run_dir: str, every: int, *, resume_step: int | None, process_index: int = 0
    ):
        self.every = int(every)
        self.path = os.path.join(run_dir, samples_file(process_index))
        self.enabled = bool(self.every)
        if self.enabled and os.path.exists(self.path):
            keep = []
            if resume_step is not None:
                with open(self.path, encoding="utf-8") as f:
                    keep = [
                        line
                        for line in f
                        if _is_row(line) and json.loads(line).get("step", 0) <= resume_step
                    ]
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(keep)
            os.replace(tmp, self.path)

    def write(self, step: int, episodes: list[dict]) -> None:
        """Append this step's episodes if it is an ``every``-th step."""
        if not self.enabled or step % self.every:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            for ep in episodes:
                row = {"step": step, **scalarize(ep)}
                f.write(json.dumps(row, ensure_ascii=False, allow_nan=False, default=repr) + "\n")
