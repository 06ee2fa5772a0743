"""Multi-host setup and host-local ↔ global batches.

On a TPU pod or a multi-node GPU job every host runs the same program; each host loads only
its own rows of the global batch and ``jax.make_array_from_process_local_data`` stitches them
into one global ``jax.Array`` laid out by the batch sharding.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel.rules import DEFAULT_RULES, MeshAxes, batch_sharding, replicated

log = logging.getLogger(__name__)

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} must be an integer") from None


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto_detect: bool = False,
) -> bool:
    """Start ``jax.distributed`` for a multi-process run, from arguments or the environment.

    Arguments win; missing ones are read from ``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``. On CPU, cross-process collectives use gloo
    (``jax_cpu_collectives_implementation="gloo"``). Must run before any other JAX call.

    Args:
      coordinator_address: "host:port" of process 0's coordinator service.
      num_processes: total number of processes.
      process_id: this process's index in ``[0, num_processes)``.
      auto_detect: with nothing given, still call ``jax.distributed.initialize()`` so JAX
        detects a TPU pod / SLURM / Open MPI cluster by itself.

    Returns:
      True when ``jax.distributed`` was initialised (or already was), False for a
      single-process run (nothing given, ``num_processes == 1``, no auto-detection).

    Raises:
      ConfigError: only some of the three values are given, or they are inconsistent.
    """
    if jax.distributed.is_initialized():
        return True
    address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    n = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    pid = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    given = {"coordinator_address": address, "num_processes": n, "process_id": pid}
    if all(v is None for v in given.values()):
        if auto_detect:
            jax.distributed.initialize()
            return True
        return False
    if n == 1 and address is None:
        return False
    if address is None or n is None or pid is None:
        missing = [k for k, v in given.items() if v is None]
        raise ConfigError(
            f"distributed init needs coordinator_address, num_processes and "
            f"process_id; missing {missing} (pass them or set {ENV_COORDINATOR}, "
            f"{ENV_NUM_PROCESSES}, {ENV_PROCESS_ID})"
        )
    if not 0 <= pid < n:
        raise ConfigError(f"process_id={pid} must be in [0, num_processes={n})")
    # jax.config options are dynamic attributes, unknown to the checker.
    configured = jax.config.jax_platforms  # type: ignore[attr-defined]
    platforms = os.environ.get("JAX_PLATFORMS", "") or str(configured or "")
    if platforms in ("", "cpu") or platforms.startswith("cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=address, num_processes=n, process_id=pid)
    log.info("jax.distributed initialised: process %d of %d (coordinator %s)", pid, n, address)
    return True


def host_local_rows(
    mesh: Mesh, global_batch_size: int, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> slice:
    """The contiguous slice of global batch rows this process must load.

    Args:
      mesh: the global mesh.
      global_batch_size: B, divisible by the batch axes' size.

    Returns:
      ``slice(start, stop)`` of rows held by this process's devices under
      :func:`~jaxrl_llm.parallel.batch_sharding`.

    Raises:
      ConfigError: B is not divisible, or this process's rows are not contiguous (a mesh
        whose batch axes interleave hosts).
    """
    sharding = batch_sharding(mesh, rules)
    shards = int(np.prod([mesh.shape[a] for a in sharding.spec[0]])) if sharding.spec[0] else 1
    if global_batch_size % shards:
        raise ConfigError(
            f"global batch size {global_batch_size} is not divisible by the "
            f"{shards} batch shards of mesh {dict(mesh.shape)}"
        )
    index_map = sharding.addressable_devices_indices_map((global_batch_size,))
    rows = sorted(
        {
            (idx[0].start or 0, idx[0].stop if idx[0].stop is not None else global_batch_size)
            for idx in index_map.values()
            if idx is not None
        }
    )
    start, stop = rows[0][0], rows[-1][1]
    covered = sum(b - a for a, b in rows)
    if covered != stop - start:
        raise ConfigError(
            f"this process's batch rows {rows} are not contiguous on mesh "
            f"{dict(mesh.shape)}; put hosts on the outermost batch axis"
        )
    return slice(start, stop)


def host_local_batch_to_global(
    batch: Mapping[str, Any], mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> dict[str, jax.Array]:
    """Assemble per-process rows into global, batch-sharded ``jax.Array`` s.

    Each process passes its own rows (``batch[k]`` of shape ``[B_local, ...]``, the rows
    :func:`host_local_rows` names); the result has ``[B_local · num_processes, ...]`` global
    shape. Scalars (``[]``, e.g. ``loss_denominator``) must be equal on every process and
    come back replicated. In a single process this is ``jax.device_put`` with the batch
    sharding.
    """
    rows = batch_sharding(mesh, rules)
    rep = replicated(mesh)
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        sharding: NamedSharding = rep if value.ndim == 0 else rows
        if value.ndim == 0:
            out[key] = jax.make_array_from_process_local_data(sharding, value, ())
        else:
            global_shape = (value.shape[0] * jax.process_count(),) + value.shape[1:]
            out[key] = jax.make_array_from_process_local_data(sharding, value, global_shape)
    return out
