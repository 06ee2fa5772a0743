"""The run directory (``output_dir``) a run starts in: checked before anything loads (a
directory this process can write, or a bucket URI; never over another run's checkpoints unless
resuming), created and probed around the start, removed again when a refused run wrote nothing.
Used by :func:`jaxrl_llm.train.api.run_training` and the Python trainers alike.
"""

from __future__ import annotations

import contextlib
import os

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.run import paths


def jax_main_process() -> bool:
    """Whether this is JAX's process 0 (the one that writes files)."""
    import jax

    return jax.process_index() == 0


def checkpoint_steps(out: str) -> list[int]:
    """The complete steps under ``out/checkpoints``, ascending (``out`` may be a URI).

    Raises:
      ConfigError: a URI that cannot be listed: its filesystem package is missing (``gcsfs``
        for ``gs://``), or the store refused (credentials, a missing bucket), in one line.
    """
    from jaxrl_llm.train.run.checkpoint_steps import complete_steps

    where = paths.join(paths.resolve(out), "checkpoints")
    if not paths.is_remote(out):
        return complete_steps(where)
    try:
        return complete_steps(where)
    except ImportError as e:
        raise ConfigError(
            f"output_dir {out!r}: {e} (epath opens this URI through fsspec and that package; "
            f"orbax writes the arrays through TensorStore's own driver)"
        ) from None
    except Exception as e:  # a store's own errors: credentials, a missing bucket, the network
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(
            f"output_dir {out!r} cannot be listed ({type(e).__name__}: {first}); check the "
            f"bucket and its credentials"
        ) from None


def _make_output_dir(out: str) -> None:
    """Create and probe a new ``output_dir`` (an existing one, a resume, is left as it is). A
    URI (``gs://...``) is left to orbax, which creates it at the first save and reports what
    it cannot write: probing a bucket here would need its credentials before the model loads."""
    if paths.is_remote(out):
        return
    try:
        if not os.path.isdir(out):
            os.makedirs(out, exist_ok=True)  # the processes of a job create it together
            probe = os.path.join(out, f".write_test.{os.getpid()}")
            with open(probe, "w", encoding="utf-8") as f:
                f.write("ok")
            os.remove(probe)
        elif not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(13, "permission denied")
    except OSError as e:
        raise ConfigError(
            f"output_dir {out!r} cannot be written ({e.strerror or e}); choose another output_dir"
        ) from None


@contextlib.contextmanager
def made_output_dir(out: str):
    """Create and probe ``output_dir`` (:func:`_make_output_dir`) around a run's start; when
    the run is refused or fails with nothing written (a bad reward, model or data found while
    the trainer is built), a directory this call created is removed again, so a refused
    config leaves no empty run directory with a ``.lock`` behind. Anything written (a
    ``metrics.jsonl``, a checkpoint, the rows of a Python dataset) keeps it."""
    fresh = not paths.is_remote(out) and not os.path.lexists(out)
    _make_output_dir(out)
    try:
        yield
    except BaseException:
        if fresh:
            _remove_if_unused(out)
        raise


def _remove_if_unused(out: str) -> None:
    """Remove ``out`` when it holds nothing of a run: only its ``.lock``, empty folders and
    the tokenizer copy a checkpointer writes when it is made (``checkpoints/tokenizer/``)."""
    import shutil

    tokenizer = os.path.join(out, "checkpoints", "tokenizer")
    for root, _, files in os.walk(out):
        if root == tokenizer or root.startswith(tokenizer + os.sep):
            continue
        if any(f != ".lock" or root != out for f in files):
            return
    shutil.rmtree(out, ignore_errors=True)


def check_output_dir(cfg: RunConfig) -> None:
    """``output_dir`` must be a directory (or not exist yet) this process can write; a fresh
    run (no ``resume``) must not start over another run's checkpoints. On a URI
    (``gs://...``) only the latter is checked, through its filesystem package (the local
    checks, a file in the way, a link, write permission, have no meaning there)."""
    out = cfg.output_dir
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"output_dir {out!r}: not valid UTF-8 (checkpoint paths must be); rename it"
        ) from None
    paths.check_uri(out)  # gs:// with no bucket, before anything is written
    if paths.is_remote(out):
        _check_fresh(cfg)
        return
    if os.path.islink(out) and not os.path.exists(out):
        raise ConfigError(
            f"output_dir {out!r} is a symbolic link that leads nowhere (a loop, or a link to a "
            f"missing directory); choose another output_dir"
        )
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(
            f"output_dir {out!r} exists and is not a directory; choose another output_dir"
        )
    parent = os.path.abspath(out)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(
            f"output_dir {out!r}: {parent!r} is a file, not a directory; choose another output_dir"
        )
    if not os.access(parent, os.W_OK | os.X_OK) or parent.startswith(("/proc", "/sys")):
        raise ConfigError(f"output_dir {out!r}: {parent!r} is not writable; choose another")
    _check_fresh(cfg)


def _check_fresh(cfg: RunConfig) -> None:
    """A fresh run (no ``resume``) must not start over another run's checkpoints."""
    out = cfg.output_dir
    steps = checkpoint_steps(out)
    if steps and not cfg.resume:
        raise ConfigError(
            f"output_dir {out!r} already holds checkpoints of a run (latest step "
            f"{steps[-1]}); pass --resume to continue it, or choose a new "
            f"output_dir"
        )
