"""The checks a multi-process job makes at start, before step 1 (every process runs them).

- **The same config everywhere** (:func:`check_same_config`): every process hashes its resolved
  config (every key but ``output_dir``, which :func:`check_shared_output_dir` checks itself);
  the hashes are gathered, and on a mismatch process 0's config is broadcast and every process
  stops with the same line naming the first differing key and its values. Unchecked, two
  ``prompts_per_step`` trained a mix of both, two ``data.train`` files a mix of their rows,
  two ``optim.lr`` let the "replicated" weights diverge, and two ``max_steps`` hung.
- **One output_dir that every process sees** (:func:`check_shared_output_dir`): process 0
  writes :data:`MARKER` holding a new id for the job into ``output_dir``; after a barrier
  every process reads it, and the job stops in one line when one does not see that id (a
  per-host disk: each process would write only its own shards of a checkpoint, and orbax
  waited for good at the first one). ``output_dir`` may be a URI (``gs://bucket/run``): the
  marker is written and read through :class:`etils.epath.Path`, as orbax writes there.

Exchanges are fixed-size ``uint8`` arrays through
:func:`jax.experimental.multihost_utils.process_allgather` and ``broadcast_one_to_all``. A
single process skips both.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from typing import Any

import jax
import numpy as np

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.run import paths
from jaxrl_llm.train.run.faults import fault_point

#: The file in ``output_dir`` that holds the id of the job that writes there.
MARKER = ".jaxrl-llm-job"

#: Config keys that may differ between processes (checked otherwise).
PER_PROCESS_KEYS = ("output_dir",)


def flat_config(cfg: RunConfig) -> dict[str, str]:
    """The config as ``{"rollout.prompts_per_step": "8", ...}`` (values as JSON), less
    :data:`PER_PROCESS_KEYS`: what every process of a job must agree on."""
    from jaxrl_llm.train.config.config_io import to_dict

    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = json.dumps(node, sort_keys=True, default=str)

    walk(to_dict(cfg), "")
    for key in PER_PROCESS_KEYS:
        out.pop(key, None)
    return out


def config_digest(flat: dict[str, str]) -> bytes:
    """The SHA-256 of a :func:`flat_config`."""
    return hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).digest()


def first_difference(mine: dict[str, str], theirs: dict[str, str]) -> str | None:
    """The first key (in sorted order) whose value differs between two flat configs (a key one
    lacks counts), or None."""
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) != theirs.get(key):
            return key
    return None


def _broadcast_bytes(data: bytes | None) -> bytes:
    """Process 0's ``data`` on every process (others pass None)."""
    from jax.experimental import multihost_utils

    size = int(multihost_utils.broadcast_one_to_all(np.int32(len(data or b""))))
    buf = np.zeros(max(size, 1), np.uint8)
    if data:
        buf[:size] = np.frombuffer(data, np.uint8)
    return bytes(np.asarray(multihost_utils.broadcast_one_to_all(buf))[:size])


def _allgather_text(text: str, width: int = 1024) -> list[str]:
    """Every process's ``text`` (cut to ``width`` bytes), in process order."""
    from jax.experimental import multihost_utils

    buf = np.zeros(width, np.uint8)
    raw = text.encode()[:width]
    buf[: len(raw)] = np.frombuffer(raw, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(buf)).reshape(-1, width)
    return [bytes(r).rstrip(b"\0").decode(errors="replace") for r in rows]


def check_same_config(cfg: RunConfig) -> None:
    """Stop the job when the processes' configs differ (module docstring).

    Raises:
      ConfigError: on every process, one line naming the first differing key, the process
        whose value differs and both values.
    """
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    flat = flat_config(cfg)
    digests = np.asarray(
        multihost_utils.process_allgather(np.frombuffer(config_digest(flat), np.uint8))
    ).reshape(jax.process_count(), -1)
    if (digests == digests[0]).all():
        return
    ref = json.loads(
        _broadcast_bytes(json.dumps(flat).encode() if jax.process_index() == 0 else None)
    )
    key = first_difference(flat, ref)
    mine = "" if key is None else json.dumps([key, flat.get(key, "(unset)")])
    said = _allgather_text(mine)
    for pid, text in enumerate(said):
        if text:
            key, value = json.loads(text)
            raise ConfigError(
                f"the processes' configs differ: {key} is {value} on process {pid} but "
                f"{ref.get(key, '(unset)')} on process 0; every process of a job must run the "
                f"same config and overrides (only --process-id and output_dir's host differ)"
            )
    raise ConfigError("the processes' configs differ (their digests do); run the same config")


def check_shared_output_dir(output_dir: str) -> None:
    """Stop the job unless every process sees process 0's ``output_dir`` (module docstring).

    Raises:
      ConfigError: on every process, one line naming the processes that do not see it.
    """
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    root = paths.as_epath(output_dir)
    path = root / MARKER
    job = _broadcast_bytes(uuid.uuid4().hex.encode() if jax.process_index() == 0 else None)
    if jax.process_index() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if paths.is_remote(output_dir):
            path.write_text(job.decode())  # an object store writes an object whole
        else:
            tmp = root / f"{MARKER}.tmp-{os.getpid()}"
            tmp.write_text(job.decode())
            os.replace(tmp, path)
    multihost_utils.sync_global_devices("jaxrl_llm/output_dir_marker")
    try:
        seen = path.read_text().strip() == job.decode()
    except OSError:
        seen = False
    flags = np.asarray(multihost_utils.process_allgather(np.array([seen], np.uint8))).reshape(-1)
    blind = [i for i, ok in enumerate(flags) if not ok]
    if blind:
        raise ConfigError(
            f"output_dir {output_dir!r}: process(es) {blind} do not see the marker {MARKER} that "
            f"process 0 wrote there for this job: output_dir must be storage every host sees (a "
            f"shared filesystem, or a bucket), since each process writes its own shards of "
            f"every checkpoint into it"
        )


def check_job(cfg: RunConfig) -> None:
    """Both checks (:func:`check_same_config`, then :func:`check_shared_output_dir`)."""
    check_same_config(cfg)
    check_shared_output_dir(cfg.output_dir)
    fault_point("job", 0)  # the job is checked; the run has not started
