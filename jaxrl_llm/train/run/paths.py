"""Where a run's files go: ``output_dir`` (checkpoints, the job marker) may be a local path or
a URI that :class:`etils.epath.Path` opens (``gs://bucket/run``, ``s3://...``), the path type
orbax itself takes; logs and metrics always stay on a local disk (:func:`log_dir`).

What a URI needs: epath opens ``gs://`` / ``s3://`` / ``az://`` through ``fsspec`` and its
filesystem package (``gcsfs``, ``s3fs``, ``adlfs``); orbax writes the arrays through
TensorStore's own ``gcs`` / ``s3`` drivers. Local-disk checks (free space, the ``flock``, a
step's damaged files) are skipped on a URI, each saying why where it is skipped.
"""

from __future__ import annotations

import os
import re

from etils import epath

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.run_config import RunConfig

#: The directory, under the working directory, that holds the logs of a run whose
#: ``output_dir`` is not local and whose ``logging.dir`` is unset: ``jaxrl-llm-logs/<run>``.
LOCAL_LOGS = "jaxrl-llm-logs"


def is_remote(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URI (``gs://bucket/run``) rather than a local path (``file://``
    counts as local)."""
    text = os.fspath(path)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme != "file"


#: URI schemes of object stores whose first part is a bucket, and the bucket names each takes
#: (GCS: https://cloud.google.com/storage/docs/buckets#naming, S3:
#: https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
BUCKET_SCHEMES = {
    "gs": re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]"),
    "gcs": re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]"),
    "s3": re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
}


def check_uri(path: str | os.PathLike, key: str = "output_dir") -> None:
    """Refuse a malformed object-store URI before anything is written: ``gs://`` with no
    bucket, a bucket name the store does not allow, ``gs:/bucket`` (one slash, which a local
    path would silently become: ``./gs:/bucket``).

    Raises:
      ConfigError: one line naming ``key``, the URI and the form it takes.
    """
    text = os.fspath(path)
    scheme, sep, rest = text.partition(":")
    if scheme.lower() not in BUCKET_SCHEMES or not sep:
        return
    form = f"{scheme}://BUCKET/path"
    if not rest.startswith("//"):
        raise ConfigError(f"{key} {text!r}: a {scheme}:// URI takes two slashes: {form}")
    bucket = rest[2:].split("/", 1)[0]
    if not bucket:
        raise ConfigError(f"{key} {text!r}: no bucket name; expected {form}")
    if not BUCKET_SCHEMES[scheme.lower()].fullmatch(bucket) or ".." in bucket:
        raise ConfigError(
            f"{key} {text!r}: {bucket!r} is not a valid {scheme}:// bucket name (3 to 63 "
            f"lowercase letters, digits, '-' and '.', starting and ending with a letter or "
            f"digit); expected {form}"
        )


def resolve(path: str | os.PathLike) -> str:
    """``path`` as the run names it: a URI unchanged (less a trailing ``/``), a local path
    absolute (a ``file://`` prefix dropped).

    Raises:
      ConfigError: a malformed object-store URI (:func:`check_uri`).
    """
    text = os.fspath(path)
    check_uri(text, "path")
    if is_remote(text):
        return text.rstrip("/")
    if text.startswith("file://"):
        text = text[len("file://") :]
    return os.path.abspath(text)


def as_epath(path: str | os.PathLike) -> epath.Path:
    """``path`` (:func:`resolve`-d) as an :class:`etils.epath.Path`, what orbax takes."""
    return epath.Path(resolve(path))


def join(path: str | os.PathLike, *parts: str) -> str:
    """``path / part / ...`` as a string, for a URI or a local path alike."""
    return os.fspath(epath.Path(os.fspath(path)).joinpath(*parts)) if parts else os.fspath(path)


def run_name(cfg: RunConfig) -> str:
    """``logging.run_name``, else the last part of ``output_dir``."""
    if cfg.logging.run_name:
        return cfg.logging.run_name
    return os.path.basename(resolve(cfg.output_dir).rstrip("/")) or "run"


def log_dir(cfg: RunConfig) -> str:
    """The local directory of the run's logs and metrics (``metrics.jsonl``, ``config.yaml``,
    TensorBoard, plots, ``summary.json``, the lock): ``logging.dir`` when set, else
    ``output_dir`` when it is local, else ``jaxrl-llm-logs/<run name>`` under the working
    directory (:func:`run_name`), which the run's start line names."""
    if cfg.logging.dir:
        return os.path.abspath(cfg.logging.dir)
    if not is_remote(cfg.output_dir):
        return resolve(cfg.output_dir)
    return os.path.abspath(os.path.join(LOCAL_LOGS, run_name(cfg)))


def where_words(cfg: RunConfig) -> str | None:
    """One line stating where the logs go when they do not go to ``output_dir``, else None."""
    logs = log_dir(cfg)
    if logs == resolve(cfg.output_dir):
        return None
    return f"checkpoints go to {resolve(cfg.output_dir)}; logs and metrics to {logs}"


def lock_dir(cfg: RunConfig) -> str:
    """Where the run's lock (``.lock``, an ``flock``) lives: ``output_dir`` when it is local;
    else :func:`log_dir`, since a bucket has no ``flock`` (two runs on one bucket path from
    different hosts, or with different ``logging.dir``, are then not kept apart)."""
    if not is_remote(cfg.output_dir):
        return resolve(cfg.output_dir)
    return log_dir(cfg)
