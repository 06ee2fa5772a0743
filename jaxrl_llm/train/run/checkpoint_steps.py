"""The steps of a checkpoint root: which are finalised and which read back intact.

Finalised, from the listing alone (no orbax manager, no arrays read): :func:`complete_steps`,
:func:`last_checkpoint_words` and :data:`COMMIT_FILE`, the marker of a finished step on
``gs://``. Intact: :func:`step_damage` finds what makes a finalised step unreadable without
reading its arrays, :func:`restore_step` tells damaged files from arrays that do not fit the
target structure (a changed config), and :func:`newest_intact` falls back from the newest step
to the newest one that reads back, one line per step skipped. Saving and restoring a train
state is :mod:`jaxrl_llm.train.run.checkpoint`'s.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading

from jaxrl_llm.errors import CheckpointError
from jaxrl_llm.train.run import paths

#: The file that marks a folder finalised where there is no atomic rename: orbax writes it
#: last into each step it saves on ``gs://`` (its ``CommitFileTemporaryPath``), and takes a
#: folder of the checkpoint root without it for an unfinished step, which it removes.
COMMIT_FILE = "commit_success.txt"


def _uses_commit_file(directory: str) -> bool:
    """Whether orbax finalises steps under ``directory`` with :data:`COMMIT_FILE` (``gs://``,
    orbax's default there) rather than by renaming a temporary folder."""
    return directory.startswith("gs://")


def complete_steps(directory: str | os.PathLike) -> list[int]:
    """The finalised steps under a checkpoint root, ascending, read from the listing alone (no
    orbax manager): orbax writes a step into ``<step>.orbax-checkpoint-tmp-*`` and renames it
    to ``<step>`` when every item and every process has finished, so a step that a killed
    process was still writing is never listed. ``directory`` may be a URI: on ``gs://``, where
    orbax writes a step in place and marks it finalised with :data:`COMMIT_FILE` last, a step
    is complete when that file is there."""
    root = paths.as_epath(directory)
    if not root.is_dir():
        return []
    steps = [e for e in root.iterdir() if e.name.isdigit() and e.is_dir()]
    if _uses_commit_file(paths.resolve(directory)):
        steps = [e for e in steps if e.joinpath(COMMIT_FILE).exists()]
    return sorted(int(e.name) for e in steps)


def last_checkpoint_words(directory: str | os.PathLike) -> str:
    """``"the last complete checkpoint is step N in DIR"`` (or that there is none)."""
    steps = complete_steps(directory)
    if not steps:
        return f"no complete checkpoint in {os.fspath(directory)}"
    return f"the last complete checkpoint is step {steps[-1]} in {os.fspath(directory)}"


class _ParseNoteFilter(logging.Filter):
    """Drops orbax's "Failed to json parse Metadata file" log records: a damaged step's
    metadata is reported once, by the resume's line naming the step (:func:`step_damage`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to json parse Metadata file")


#: The filter on the ``absl`` logger of every manager that reads steps (add it once: a set).
PARSE_NOTES = _ParseNoteFilter()


class _Unreadable(Exception):
    """A step's files cannot be read back (truncated or corrupt)."""


#: Files of an orbax step that hold JSON (the step's and each item's metadata).
_JSON_FILES = ("_CHECKPOINT_METADATA", "_METADATA", "_sharding", "metadata")


def step_damage(step_dir: str, items: tuple[str, ...]) -> str | None:
    """What makes a finalised step unreadable, found without reading its arrays: an empty step
    folder, a missing item (``params/``), a zero-byte file, metadata that is not JSON; None when
    it looks intact (a local directory; a URI, ``gs://...``, is not checked here: listing
    and reading every file of a step from a bucket costs a request each). Orbax reports these
    as a structure mismatch, which would point at a config change."""
    if paths.is_remote(step_dir) or not os.path.isdir(os.path.dirname(step_dir)):
        return None  # not a local path (gs://...): orbax's own errors decide
    if not os.path.isdir(step_dir) or not os.listdir(step_dir):
        return "the step folder is empty"
    for item in items:
        if not os.path.isdir(os.path.join(step_dir, item)):
            return f"{item}/ is missing"
    for root, _, files in os.walk(step_dir):
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, step_dir)
            try:
                if os.path.getsize(path) == 0:
                    return f"{rel} is empty (0 bytes)"
                if name in _JSON_FILES or os.path.basename(root) == "array_metadatas":
                    with open(path, encoding="utf-8") as f:
                        json.load(f)
            except (ValueError, UnicodeDecodeError):
                return f"{rel} is not valid JSON"
            except OSError as e:
                return f"{rel} cannot be read ({e.strerror or e})"
    return None


def raise_if_damaged(directory: str, step: int, items: tuple[str, ...]) -> None:
    """Raise :class:`_Unreadable` with :func:`step_damage`'s words when ``directory/step``
    is damaged (``items`` are the item folders it must hold)."""
    problem = step_damage(paths.join(directory, str(step)), items)
    if problem is not None:
        raise _Unreadable(problem)


def restore_step(mgr, directory: str, step: int, args, items: tuple[str, ...]):
    """``mgr.restore(step)`` of ``items``; CheckpointError when the arrays do not match
    ``args``' structure (the config changed), :class:`_Unreadable` when the files are damaged
    (:func:`step_damage`) or cannot be read."""
    raise_if_damaged(directory, step, items)
    try:
        return mgr.restore(step, args=args)
    except (json.JSONDecodeError, FileNotFoundError) as e:
        raise _Unreadable(_first_line(e)) from None
    except KeyError as e:
        if "not found in the checkpoint" in str(e):
            raise _Unreadable(_first_line(e)) from None
        raise CheckpointError(
            f"{directory}/{step}: cannot restore into the given state structure: {_first_line(e)}"
        ) from None
    except (ValueError, TypeError) as e:
        raise CheckpointError(
            f"{directory}/{step}: cannot restore into the given state structure: {_first_line(e)}"
        ) from None
    except Exception as e:  # tensorstore raises a bare Exception for unreadable data
        _quiet_abandoned_reads()
        raise _Unreadable(_first_line(e)) from None


_QUIETED = False  # whether _quiet_abandoned_reads installed its hooks


def _quiet_abandoned_reads() -> None:
    """After a failed restore, orbax's other array reads are abandoned: their coroutines'
    errors and their callbacks into the closed event loop would each print a traceback (a
    truncated checkpoint printed ~600 lines). Drop those reports, keep every other. Installed
    once per process."""
    global _QUIETED
    if _QUIETED:
        return
    _QUIETED = True
    previous = sys.unraisablehook

    def hook(report) -> None:
        text = f"{report.exc_value!r} {report.object!r}"
        if "_read_array_index" in text or "Event loop is closed" in text:
            return
        previous(report)

    sys.unraisablehook = hook
    previous_thread = threading.excepthook

    def thread_hook(args) -> None:
        if isinstance(args.exc_value, RuntimeError) and "Event loop is closed" in str(
            args.exc_value
        ):
            return
        previous_thread(args)

    threading.excepthook = thread_hook


def newest_intact(directory: str, steps: list[int], step: int | None, restore):
    """``(s, restore(s))`` for ``step``, or with ``step`` None for the newest step that reads
    back intact: an unreadable one is skipped with one line on stderr naming it and why.

    Raises:
      CheckpointError: no finalised step, or none of those tried is readable (each named).
    """
    if not steps:
        raise CheckpointError(f"no finalised checkpoint in {directory}")
    order = [step] if step is not None else sorted(steps, reverse=True)
    skipped: list[str] = []
    for k, s in enumerate(order):
        try:
            return s, restore(s)
        except _Unreadable as e:
            skipped.append(f"step {s} ({e})")
            if k + 1 < len(order):
                print(
                    f"checkpoint {directory}: step {s} is unreadable, its files truncated or "
                    f"corrupt ({e}); trying step {order[k + 1]}",
                    file=sys.stderr,
                    flush=True,
                )
    raise CheckpointError(
        f"{directory}: no readable checkpoint; truncated or corrupt files in " + "; ".join(skipped)
    )


def _first_line(e: BaseException, limit: int = 160) -> str:
    line = (str(e).splitlines() or [type(e).__name__])[0].split(" See full TensorStore")[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."
