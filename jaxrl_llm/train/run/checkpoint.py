"""Orbax checkpoints of the train state: async, every N steps, keep the last K, atomic,
restorable onto a different mesh, plus ``restore_model`` for export.

Layout of ``<directory>/<step>/`` (one orbax composite checkpoint per step):
``params/``, ``opt_state/`` (sharded arrays, written by every process for its own shards),
``meta/`` (step, rng), ``extra/`` (a JSON dict: data-iterator position, run info, …) and
``model_config/`` (the :class:`~jaxrl_llm.models.ModelConfig` fields as JSON, enums as
strings). JSON items are written by process 0 only; orbax coordinates array writes across
hosts. ``<directory>/tokenizer/`` holds a tokenizer saved once with ``save_pretrained``.

Atomicity: orbax writes a step into ``<step>.orbax-checkpoint-tmp-*`` and renames it when
every item (and every host) has finished; unfinalised directories are never listed as steps,
so a crash mid-save leaves the previous checkpoint as the latest one (leftover temporaries
are removed when the next manager opens the directory). The tokenizer directory is written
the same way (temporary name, then rename).

Damage: restoring the newest step skips one whose files are unreadable — truncated arrays, a
missing item (``params/``), a zero-byte file, metadata that is not JSON, an empty step folder
(:mod:`~jaxrl_llm.train.run.checkpoint_steps`) — with one line naming it, and takes the
previous one; only arrays that read back but do not fit the target structure (a changed config)
are a structure error. A save the disk cannot hold is refused before it writes, in one line
(the space needed, free, where).

Where: ``directory`` is a local path or a URI (``gs://bucket/run/checkpoints``) handed to orbax
as an :class:`etils.epath.Path` (:mod:`jaxrl_llm.train.run.paths`). On a URI the free-space
check and the damage check are skipped (no local disk to ask: orbax's own errors decide),
and the tokenizer is written locally and copied up.

Restoring onto another mesh: pass the abstract state of the *new* mesh (shapes + shardings,
from :func:`~jaxrl_llm.train.abstract_train_state`); orbax reads each device's slice directly.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxrl_llm.errors import CheckpointError
from jaxrl_llm.models.config import ModelConfig, known_keys
from jaxrl_llm.train.programs.state import TrainState
from jaxrl_llm.train.run import paths
from jaxrl_llm.train.run.checkpoint_steps import (
    COMMIT_FILE,
    PARSE_NOTES,
    newest_intact,
    raise_if_damaged,
    restore_step,
)

_ARRAY_ITEMS = ("params", "opt_state", "meta")
_JSON_ITEMS = ("extra", "model_config")
#: The items :meth:`CheckpointManager.restore` reads (``model_config`` is for export only).
RESTORED_ITEMS = ("params", "opt_state", "meta", "extra")
TOKENIZER_DIR = "tokenizer"


def model_config_to_dict(config: ModelConfig) -> dict[str, Any]:
    """ModelConfig -> JSON-ready dict under the flat names (:meth:`ModelConfig.flat`: the
    format checkpoints have always had, so an older reader loads it too), enums as their
    string values, tuples as lists."""
    out: dict[str, Any] = {}
    for name, v in config.flat().items():
        if isinstance(v, enum.Enum):
            v = v.value
        elif isinstance(v, tuple):
            v = [t.value if isinstance(t, enum.Enum) else t for t in v]
        out[name] = v
    return out


def model_config_from_dict(d: Mapping[str, Any], *, source: str = "checkpoint") -> ModelConfig:
    """Inverse of :func:`model_config_to_dict`; groups given as nested dicts
    (``{"attn": {"num_heads": 4, ...}}``) are read too. Unknown keys raise CheckpointError."""
    names = known_keys()
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise CheckpointError(
            f"{source}: model_config has unknown keys {unknown}; allowed: {names}"
        )
    try:
        return ModelConfig(**d)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: invalid model_config: {e}") from None


def _handlers() -> dict[str, ocp.CheckpointHandler]:
    h: dict[str, ocp.CheckpointHandler] = {k: ocp.StandardCheckpointHandler() for k in _ARRAY_ITEMS}
    h.update({k: ocp.JsonCheckpointHandler() for k in _JSON_ITEMS})
    return h


class CheckpointManager:
    """Save / restore :class:`~jaxrl_llm.train.TrainState` with orbax.

    Args:
      directory: checkpoint root (created if missing): a local path or a URI that
        :class:`etils.epath.Path` opens (``gs://bucket/run/checkpoints``).
      save_every: save when ``step % save_every == 0`` (``save(..., force=True)`` always saves).
      keep: keep the last ``keep`` finalised checkpoints (None = all).
      async_save: write in a background thread; training continues meanwhile
        (call :meth:`wait_until_finished` before reading the files or exiting).
      model_config: saved with every step so :func:`restore_model` can rebuild the model.
      tokenizer: optional transformers tokenizer, saved once under ``<directory>/tokenizer``.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        save_every: int = 1000,
        keep: int | None = 3,
        async_save: bool = True,
        model_config: ModelConfig | None = None,
        tokenizer: Any = None,
    ):
        if save_every < 1:
            raise CheckpointError(f"save_every={save_every} must be >= 1")
        if keep is not None and keep < 1:
            raise CheckpointError(f"keep={keep} must be >= 1 (or None to keep all)")
        self.directory = paths.resolve(directory)
        self.remote = paths.is_remote(self.directory)
        self.model_config = model_config
        self.save_every = int(save_every)
        # The save interval is applied here (orbax's own policy also saves the very first step).
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, cleanup_tmp_directories=True
        )
        logging.getLogger("absl").addFilter(PARSE_NOTES)  # once: filters are a set
        if tokenizer is not None and jax.process_index() == 0:
            # before orbax opens the root: on gs:// it removes every folder there that lacks
            # its commit file as an unfinished step (its cleanup runs as the manager opens)
            _save_tokenizer_once(tokenizer, paths.join(self.directory, TOKENIZER_DIR))
        self._mgr = ocp.CheckpointManager(
            paths.as_epath(self.directory), options=options, item_handlers=_handlers()
        )

    # ----- queries -------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        """Finalised steps, ascending (unfinalised temporary directories are excluded).

        Orbax deletes steps past ``keep`` in the background; a step it lists and then removes
        before reading its timestamp raises FileNotFoundError inside ``reload``. The listing is
        then taken again (a few times): the step is gone, which is the answer."""
        for attempt in range(5):
            try:
                self._mgr.reload()
                break
            except FileNotFoundError:
                if attempt == 4:
                    raise
                time.sleep(0.05)
        return sorted(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        """The newest finalised step, or None when there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    # ----- save ----------------------------------------------------------------------------
    def save(
        self,
        step: int,
        state: TrainState,
        *,
        extra: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> bool:
        """Start saving ``state`` as ``step`` (asynchronously by default).

        Args:
          step: the step number (usually ``int(state.step)``).
          state: the (sharded) train state.
          extra: JSON-serialisable dict (data iterator position, run metadata, …).
          force: save even when ``step`` is not a multiple of ``save_every``.

        Returns:
          True when a save was started.

        Raises:
          CheckpointError: ``extra`` is not JSON-serialisable.
        """
        if not force and int(step) % self.save_every:
            return False
        extra = dict(extra or {})
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint extra at step {step} is not JSON-serialisable "
                f"({e}); store plain numbers, strings, lists and dicts"
            ) from None
        items = {
            "params": ocp.args.StandardSave(state.params),
            "opt_state": ocp.args.StandardSave(state.opt_state),
            "meta": ocp.args.StandardSave({"step": state.step, "rng": state.rng}),
            "extra": ocp.args.JsonSave(extra),
        }
        if self.model_config is not None:
            items["model_config"] = ocp.args.JsonSave(model_config_to_dict(self.model_config))
        self._check_space(int(step), state)
        if (
            paths.as_epath(self.directory).joinpath(str(int(step))).is_dir()
            and int(step) in self.all_steps()
        ):
            # A finalised step that a resumed run reaches again is stale: a kill landed after
            # it was written but before the state that resumes was (a companion's checkpoint,
            # or a step skipped as unreadable). Replace it instead of failing. (The listing
            # reloads the manager only then: a reload on every save re-listed the steps orbax
            # was deleting in the background, and it deleted each twice, warning each time.)
            self._mgr.delete(int(step))
        with self._disk_full(int(step)):
            return bool(self._mgr.save(int(step), args=ocp.args.Composite(**items), force=True))

    def wait_until_finished(self) -> None:
        """Block until every pending async save is finalised.

        Raises:
          CheckpointError: the disk filled up during a save (one line).
        """
        with self._disk_full(None):
            self._mgr.wait_until_finished()

    #: Room kept beside a step's arrays for orbax's metadata files and the filesystem's blocks.
    SPACE_MARGIN = 16 * 2**20

    def _check_space(self, step: int, state: TrainState) -> None:
        """Refuse a save the disk cannot hold, before anything is written: the arrays this
        process writes (one replica of each of its shards) plus :attr:`SPACE_MARGIN`, against
        the free space of a local checkpoint directory. A URI's (a bucket's) space is not
        asked for: there is no local disk to ask, and a bucket's quota error comes from orbax.

        Raises:
          CheckpointError: one line with the space needed, the space free and where.
        """
        if self.remote or not os.path.isdir(self.directory):
            return
        need = self.SPACE_MARGIN + sum(
            shard.data.nbytes
            for leaf in jax.tree.leaves((state.params, state.opt_state, state.step, state.rng))
            if isinstance(leaf, jax.Array)
            for shard in leaf.addressable_shards
            if shard.replica_id == 0
        )
        free = shutil.disk_usage(self.directory).free
        if need > free:
            raise CheckpointError(_space_message(step, self.directory, need, free))

    @contextlib.contextmanager
    def _disk_full(self, step: int | None):
        """A save that fills the disk while it writes (another writer took the space) ends as
        one CheckpointError line instead of orbax's exception (other errors pass)."""
        try:
            yield
        except Exception as e:
            text = str(e)
            if not (
                getattr(e, "errno", None) == errno.ENOSPC
                or "No space left" in text
                or ("RESOURCE_EXHAUSTED" in text and "No space" in text)
            ):
                raise
            free = shutil.disk_usage(self.directory).free if os.path.isdir(self.directory) else 0
            raise CheckpointError(_space_message(step, self.directory, None, free)) from None

    # ----- restore -------------------------------------------------------------------------
    def restore(
        self, abstract_state: TrainState, step: int | None = None
    ) -> tuple[TrainState, dict[str, Any]]:
        """Restore a train state laid out as ``abstract_state`` (possibly on another mesh).

        Args:
          abstract_state: TrainState of ``jax.ShapeDtypeStruct`` with target shardings
            (``abstract_train_state(...)[0]`` on the new mesh).
          step: which step (default: the latest finalised one).

        Returns:
          ``(state, extra)``.

        Raises:
          CheckpointError: no finalised checkpoint, the step is missing, or the stored
            arrays do not match the target structure.
        """
        self.wait_until_finished()
        steps = self.all_steps()
        if step is not None and step not in steps:
            raise CheckpointError(
                f"checkpoint step {step} not found in {self.directory}; available: {steps}"
            )
        args = ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_state.params),
            opt_state=ocp.args.StandardRestore(abstract_state.opt_state),
            meta=ocp.args.StandardRestore({"step": abstract_state.step, "rng": abstract_state.rng}),
            extra=ocp.args.JsonRestore(),
        )
        items = RESTORED_ITEMS
        _, out = newest_intact(
            self.directory,
            steps,
            step,
            lambda s: restore_step(self._mgr, self.directory, s, args, items),
        )
        state = TrainState(
            params=out["params"],
            opt_state=out["opt_state"],
            step=out["meta"]["step"],
            rng=out["meta"]["rng"],
        )
        return state, dict(out["extra"] or {})

    def close(self) -> None:
        """Wait for pending saves and release orbax resources."""
        self._mgr.wait_until_finished()
        self._mgr.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _space_message(step: int | None, directory: str, need: int | None, free: int) -> str:
    """One line for a checkpoint the disk cannot hold: what was needed, what is free, where."""
    mb = 2**20
    what = f"the checkpoint of step {step}" if step is not None else "a checkpoint"
    needs = f"needs about {need / mb:,.1f} MB" if need is not None else "ran out of space"
    return (
        f"{what} {needs} in {directory}, which has {free / mb:,.1f} MB free"
        + (" (no space left on device)" if need is None else "")
        + "; free some space, lower checkpoint.keep, or choose another output_dir"
    )


def _save_tokenizer_once(tokenizer: Any, tok_dir: str) -> None:
    """``tokenizer.save_pretrained(tok_dir)`` unless ``tok_dir`` exists, atomically: written
    into a temporary sibling and renamed, so a run killed mid-write never leaves a partial
    tokenizer that later runs would take as saved (stale temporaries are removed). On a URI
    (``gs://``) it is written into a local temporary directory and copied up file by file,
    then :data:`COMMIT_FILE` (a copy cut short lacks it and is written again)."""
    if paths.is_remote(tok_dir):
        _copy_tokenizer_up(tokenizer, paths.as_epath(tok_dir))
        return
    if os.path.isdir(tok_dir):
        return
    parent, name = os.path.split(tok_dir)
    os.makedirs(parent, exist_ok=True)
    for entry in os.listdir(parent):
        if entry.startswith(f"{name}.tmp-"):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
    tmp = f"{tok_dir}.tmp-{os.getpid()}"
    tokenizer.save_pretrained(tmp)
    os.rename(tmp, tok_dir)


def _copy_tokenizer_up(tokenizer: Any, target) -> None:
    """``tokenizer.save_pretrained`` into a local temporary directory, then each file copied
    to ``target`` (an :class:`etils.epath.Path` on a URI), then :data:`COMMIT_FILE`, which
    also keeps orbax from removing the folder; nothing when it is there already."""
    import tempfile

    if target.joinpath(COMMIT_FILE).exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        target.mkdir(parents=True, exist_ok=True)
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), "rb") as f:
                target.joinpath(name).write_bytes(f.read())
    target.joinpath(COMMIT_FILE).write_text("tokenizer")


def _split_step_path(path: str) -> tuple[str, int | None]:
    p = paths.as_epath(path)
    if p.name.isdigit() and p.joinpath("params").is_dir():
        return paths.resolve(os.fspath(p.parent)), int(p.name)
    return path, None


def restore_model(
    path: str | os.PathLike,
    *,
    step: int | None = None,
    sharding: jax.sharding.Sharding | None = None,
) -> tuple[ModelConfig, Any, Any]:
    """Restore only the model: ``(ModelConfig, params, tokenizer or None)``.

    Args:
      path: a checkpoint root written by :class:`CheckpointManager` (or one of its step
        directories, ``<root>/<step>``).
      step: which step (default: the latest finalised, or the one named by ``path``).
      sharding: where to put every parameter (default: the first local device).

    Returns:
      The saved ModelConfig, the parameter tree (the stored dtype, usually float32 master
      weights) and the tokenizer saved under ``<root>/tokenizer`` (None when absent).

    Raises:
      CheckpointError: no checkpoint, or the step has no saved model config.
    """
    root, path_step = _split_step_path(paths.resolve(path))
    step = step if step is not None else path_step
    if not paths.as_epath(root).is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    absl_logger = logging.getLogger("absl")  # orbax's notes on read-only managers
    absl_logger.addFilter(PARSE_NOTES)
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        mgr = ocp.CheckpointManager(
            paths.as_epath(root),
            options=ocp.CheckpointManagerOptions(read_only=True),
            item_handlers=_handlers(),
        )
        try:
            config, params, step = _restore_model_step(mgr, root, step, sharding)
        finally:
            mgr.close()
    finally:
        absl_logger.setLevel(level)
    tokenizer = None
    tok_dir = paths.join(root, TOKENIZER_DIR)
    if paths.as_epath(tok_dir).is_dir():
        from transformers import AutoTokenizer  # heavy import, only when needed

        tokenizer = AutoTokenizer.from_pretrained(_local_copy(tok_dir), local_files_only=True)
    return config, params, tokenizer


def _local_copy(directory: str) -> str:
    """A local directory holding ``directory``'s files: itself when local, else a temporary
    copy (transformers reads a tokenizer from local files only)."""
    if not paths.is_remote(directory):
        return directory
    import tempfile

    tmp = tempfile.mkdtemp(prefix="jaxrl-llm-tokenizer-")
    for f in paths.as_epath(directory).iterdir():
        if f.name == COMMIT_FILE:
            continue
        with open(os.path.join(tmp, f.name), "wb") as out:
            out.write(f.read_bytes())
    return tmp


def _restore_model_step(mgr, root: str, step: int | None, sharding):
    """(config, params, step) of ``step``, or of the newest readable step when None."""
    steps = sorted(mgr.all_steps())
    if step is not None and step not in steps:
        raise CheckpointError(f"checkpoint step {step} not found in {root}; available: {steps}")
    sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def restore(s: int):
        if not paths.as_epath(root).joinpath(str(s), "model_config").is_dir():
            raise CheckpointError(
                f"{root}/{s} has no model_config; save with "
                f"CheckpointManager(..., model_config=config)"
            )
        raise_if_damaged(root, s, ("params", "model_config"))
        meta = mgr.item_metadata(s)["params"]
        target = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding), meta
        )
        args = ocp.args.Composite(
            params=ocp.args.StandardRestore(target), model_config=ocp.args.JsonRestore()
        )
        return restore_step(mgr, root, s, args, ("params", "model_config"))

    s, out = newest_intact(root, steps, step, restore)
    return model_config_from_dict(out["model_config"], source=f"{root}/{s}"), out["params"], s
