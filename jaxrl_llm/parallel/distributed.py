"""Multi-host setup and host-local ↔ global batches.

On a TPU pod or a multi-node GPU job every host runs the same program; each host loads only
its own rows of the global batch and ``jax.make_array_from_process_local_data`` stitches them
into one global ``jax.Array`` laid out by the batch sharding.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxrl_llm.errors import ConfigError, TrainingError
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


#: Seconds a process waits for the job's coordinator (process 0's service) to answer before it
#: stops with one line (``--connect-timeout`` / ``JAXRL_LLM_CONNECT_TIMEOUT_S`` override it).
#: JAX's own default is 300 s, after which its native client aborts with a C++ stack trace.
CONNECT_TIMEOUT_S = 120

#: Seconds a process may go silent (killed, out of memory, its host gone) before the others
#: stop (``distributed.failure_timeout_s``; :mod:`jaxrl_llm.parallel.peers`).
FAILURE_TIMEOUT_S = 60


def coordinator_host_port(address: str) -> tuple[str, int]:
    """``("host", port)`` of a ``"host:port"`` coordinator address (``[::1]:port`` for IPv6).

    Raises:
      ConfigError: no port, or a port that is not an integer in 1..65535 (JAX's native
        service crashes on one: ``localhost:notaport`` segfaulted).
    """
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"--coordinator {address!r}: expected HOST:PORT with a port in 1..65535, "
            f"e.g. 10.0.0.2:8476"
        )
    return host, int(port)


def _check_port_free(address: str, port: int) -> None:
    """Process 0 binds the coordinator's port (all addresses, as JAX's service does) and lets
    it go, so a port in use is one line instead of the service's native abort."""
    import socket

    for family, where in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((where, port))
            return
        except OSError as e:
            if e.errno in (98, 48):  # EADDRINUSE (Linux, macOS)
                raise ConfigError(
                    f"--coordinator {address}: port {port} is already in use on this host "
                    f"(another job, or another process of this job also started as "
                    f"--process-id 0); give each job its own port and process 0 to one process"
                ) from None
            if family == socket.AF_INET6:
                continue
            raise ConfigError(f"--coordinator {address}: cannot bind port {port}: {e}") from None
        finally:
            s.close()


def _wait_for_coordinator(address: str, host: str, port: int, timeout_s: float) -> None:
    """A process other than 0 waits until the coordinator's port accepts a connection (process
    0 may start later), for at most ``timeout_s`` seconds.

    Raises:
      ConfigError: the coordinator did not answer in time, in one line naming the timeout.
    """
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    problem = "no answer"
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout_s)):
                return
        except OSError as e:
            problem = e.strerror or str(e)
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"--coordinator {address}: coordinator unreachable after {timeout_s:g} s "
                f"({problem}); start process 0 (--process-id 0) of the job, check the address, "
                f"or raise --connect-timeout"
            )
        time.sleep(0.5)


def connect_timeout() -> float:
    """Seconds to wait for the job to join: ``JAXRL_LLM_CONNECT_TIMEOUT_S`` or
    :data:`CONNECT_TIMEOUT_S`."""
    value = os.environ.get("JAXRL_LLM_CONNECT_TIMEOUT_S", "")
    try:
        return float(value) if value else float(CONNECT_TIMEOUT_S)
    except ValueError:
        raise ConfigError(
            f"JAXRL_LLM_CONNECT_TIMEOUT_S={value!r} must be a number of seconds"
        ) from None


@contextlib.contextmanager
def _join_watch(address: str, n: int, pid: int, timeout_s: float):
    """Exit with one line when ``jax.distributed.initialize`` has not returned within
    ``timeout_s`` (the job did not fill up); JAX's own deadline comes later and aborts."""
    done = threading.Event()

    def watch() -> None:
        if done.wait(timeout_s):
            return
        os.write(
            2,
            f"jaxrl-llm: error: process {pid}: the job at {address} did not assemble within "
            f"{timeout_s:g} s: not all {n} processes joined (one not started, or two given the "
            f"same --process-id); each process needs its own id in 0..{n - 1}\n".encode(),
        )
        os._exit(1)

    thread = threading.Thread(target=watch, name="jaxrl-llm-join", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto_detect: bool = False,
    connect_timeout_s: float | None = None,
    failure_timeout_s: float = FAILURE_TIMEOUT_S,
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
      connect_timeout_s: how long to wait for the whole job to join (default
        :data:`CONNECT_TIMEOUT_S`, or ``JAXRL_LLM_CONNECT_TIMEOUT_S``).
      failure_timeout_s: JAX's heartbeat timeout is set to this plus 30 s, so that the run's
        own watch on its peers (:mod:`jaxrl_llm.parallel.peers`, ``failure_timeout_s``) speaks
        first and JAX's native abort is only the backstop.

    Start-up faults end in one line before JAX's native client starts where they can be seen
    from Python: a coordinator address without a valid port, process 0's port already in use
    (a second process 0, or another job), a coordinator that does not answer within
    ``connect_timeout_s``; a job that does not fill up within it (a process missing, two
    processes given the same id) is stopped by a watch thread with one line, before JAX's own
    deadline (``connect_timeout_s`` + 15 s) would abort the process.

    Returns:
      True when ``jax.distributed`` was initialised (or already was), False for a
      single-process run (nothing given, ``num_processes == 1``, no auto-detection).

    Raises:
      ConfigError: only some of the three values are given, or they are inconsistent, or a
        start-up fault above (one line).
    """
    if jax.distributed.is_initialized():
        return True
    address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    n = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    pid = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    given = {"coordinator_address": address, "num_processes": n, "process_id": pid}
    if all(v is None for v in given.values()):
        if auto_detect:
            jax.distributed.initialize(
                initialization_timeout=int(
                    connect_timeout() if connect_timeout_s is None else connect_timeout_s
                ),
                heartbeat_timeout_seconds=int(failure_timeout_s) + 30,
            )
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
    timeout = connect_timeout() if connect_timeout_s is None else float(connect_timeout_s)
    host, port = coordinator_host_port(address)
    if pid == 0:
        _check_port_free(address, port)
    else:
        _wait_for_coordinator(address, host, port, timeout)
    with _join_watch(address, n, pid, timeout):
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=n,
            process_id=pid,
            initialization_timeout=int(timeout) + 15,
            heartbeat_timeout_seconds=int(failure_timeout_s) + 30,
        )
    _JOB.update(address=address, host=host, failure_timeout_s=float(failure_timeout_s))
    log.info("jax.distributed initialised: process %d of %d (coordinator %s)", pid, n, address)
    return True


#: The job this process joined through :func:`initialize_distributed` (its coordinator).
_JOB: dict[str, Any] = {}


def watch_peers(checkpoints: Any = None) -> Any:
    """Start this process's watch on the other processes of the job
    (:class:`jaxrl_llm.parallel.peers.PeerWatch`, with the ``failure_timeout_s`` given to
    :func:`initialize_distributed`); every process must call it, after joining. ``checkpoints``
    returns the words naming the last complete checkpoint, for the line a loss prints.

    Returns:
      The watch, or None in a single process or a job JAX detected by itself (its
      coordinator's host is not known here: JAX's heartbeat alone watches it).

    Raises:
      TrainingError: the sockets could not connect (one line).
    """
    if jax.process_count() == 1 or "host" not in _JOB:
        return None
    from jax.experimental import multihost_utils

    from jaxrl_llm.parallel.peers import PeerWatch

    def exchange_port(port: int | None) -> int:
        return int(multihost_utils.broadcast_one_to_all(np.int32(port or 0)))

    kwargs = {} if checkpoints is None else {"checkpoints": checkpoints}
    try:
        return PeerWatch(
            jax.process_index(),
            jax.process_count(),
            _JOB["host"],
            _JOB["failure_timeout_s"],
            exchange_port,
            **kwargs,
        )
    except OSError as e:  # a process that never connected, a port the network blocks
        raise TrainingError(
            f"process {jax.process_index()}: the watch on the job's other processes could not "
            f"start ({e.strerror or e}); process 0's host must accept TCP connections from "
            f"every host on an ephemeral port"
        ) from None


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
    rows, rep = batch_sharding(mesh, rules), replicated(mesh)
    return {k: _from_local(v, rows, rep) for k, v in batch.items()}


# ----- multi-controller online RL ----------------------------------------------------------------
# Every process runs the same loop. Each samples and scores its own share of the step's prompts
# on its own devices (``process_share``; its part of the sampler's copy:
# ``parallel/sampler_copy.py``) and keeps those rows: host-local experience. They enter the
# jitted programs as this process's part of global arrays split by rows over the whole mesh
# (``on_processes(..., local_rows=True)``); what a step needs of the whole batch (batch-level
# normalisation, metrics) is computed by programs on those global arrays or from a few gathered
# numbers (``gather_numbers``). No row crosses hosts outside the programs' collectives.

#: Environment variables by which a launcher announces a multi-process job that
#: ``jax.distributed.initialize()`` can detect by itself: Cloud TPU pod slices (several
#: workers), SLURM (several tasks), Open MPI (several ranks).
CLUSTER_ENV = {
    "TPU_WORKER_HOSTNAMES": lambda v: "," in v,
    "SLURM_NTASKS": lambda v: v.isdigit() and int(v) > 1,
    "OMPI_COMM_WORLD_SIZE": lambda v: v.isdigit() and int(v) > 1,
}


def detected_cluster() -> str | None:
    """The variable that shows this process is one of a detectable multi-process job, or
    None (a single-host run: ``jax.distributed`` is not started)."""
    for name, is_multi in CLUSTER_ENV.items():
        value = os.environ.get(name, "")
        if value and is_multi(value):
            return name
    return None


def process_share(n: int, index: int | None = None, count: int | None = None) -> slice:
    """This process's contiguous share of ``n`` items (``np.array_split``'s sizes: the first
    ``n mod count`` shares one larger), in process order, so that the shares concatenated in
    process order are the ``n`` items."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (index < extra))


def to_global(tree: Any, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> Any:
    """Host arrays that every process holds whole (an offline batch every host reads) as
    global arrays: rows (rank ≥ 1) split over the batch axes, scalars replicated. Device
    arrays pass."""
    rows, rep = batch_sharding(mesh, rules), replicated(mesh)

    def put(x):
        if isinstance(x, jax.Array) or not isinstance(x, np.ndarray | np.generic):
            return x
        x = np.asarray(x)
        sharding = rep if x.ndim == 0 else rows
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, tree)


def _is_local(x: Any) -> bool:
    """A leaf that holds this process's rows: a host array, or a device array on this
    process's devices only (a global array spanning processes is not one)."""
    if isinstance(x, jax.Array):
        return x.is_fully_addressable
    return isinstance(x, np.ndarray | np.generic)


def rows_to_global(
    tree: Any, mesh: Mesh | None = None, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> Any:
    """This process's rows as its part of global arrays (host-local batches).

    Every process passes leaves of the same shape ``[n, ...]`` (its n rows); each comes back
    as one ``[n · processes, ...]`` array split by rows, process p's rows at
    ``[p·n, (p+1)·n)``, built with ``jax.make_array_from_process_local_data`` (no row leaves
    its host). ``mesh``: split over its batch axes (the programs' layout: every process's
    devices must hold that process's contiguous block, :func:`check_host_blocks`); None:
    over :func:`process_mesh`, one device per process. Scalars must be equal on every
    process and come back replicated; global arrays and non-array leaves pass. One process:
    the tree unchanged.
    """
    if jax.process_count() == 1:
        return tree
    rows = batch_sharding(mesh, rules) if mesh is not None else _process_rows()
    rep = replicated(mesh if mesh is not None else process_mesh())
    return jax.tree.map(lambda x: _from_local(x, rows, rep) if _is_local(x) else x, tree)


def _from_local(x: Any, rows: NamedSharding, rep: NamedSharding) -> jax.Array:
    """One leaf of this process's rows as its part of a global array (a scalar: replicated)."""
    x = np.asarray(x)
    if x.ndim == 0:
        return jax.make_array_from_process_local_data(rep, x, ())
    shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
    return jax.make_array_from_process_local_data(rows, x, shape)


def rows_to_local(tree: Any) -> Any:
    """Global arrays split by rows over processes back to this process's rows (numpy): the
    rows its devices hold, in order (a replica's copy once). Replicated and fully
    addressable leaves come back whole as numpy; non-array leaves pass."""

    def get(x):
        if not isinstance(x, jax.Array):
            return x
        if x.is_fully_addressable:
            return np.asarray(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        blocks: dict[int, np.ndarray] = {}
        for shard in x.addressable_shards:
            start = (shard.index[0].start or 0) if shard.index else 0
            blocks.setdefault(start, np.asarray(shard.data))
        return np.concatenate([blocks[k] for k in sorted(blocks)], 0)

    return jax.tree.map(get, tree)


@functools.cache
def process_mesh() -> Mesh:
    """A 1-D mesh (axis ``processes``) of one device per process, in process order: where
    host-local rows meet for a program that needs the whole batch (a batch-level
    normalisation) without any layout of the learner's."""
    first: dict[int, Any] = {}
    for d in sorted(jax.devices(), key=lambda d: d.id):
        first.setdefault(d.process_index, d)
    return Mesh(np.array([first[p] for p in sorted(first)]), ("processes",))


def _process_rows() -> NamedSharding:
    from jax.sharding import PartitionSpec

    return NamedSharding(process_mesh(), PartitionSpec("processes"))


def check_host_blocks(mesh: Mesh, rows: int, rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> None:
    """Refuse, in one line, a mesh on which process p's devices do not hold the p-th block of
    ``rows`` global batch rows (hosts not outermost on the batch axes): host-local rows would
    land in another process's place."""
    if jax.process_count() == 1:
        return
    held = host_local_rows(mesh, rows, rules)
    block = rows // jax.process_count()
    want = slice(jax.process_index() * block, (jax.process_index() + 1) * block)
    if held != want:
        raise ConfigError(
            f"on mesh {dict(mesh.shape)} process {jax.process_index()}'s devices hold batch "
            f"rows {held.start}..{held.stop - 1}, not its own {want.start}..{want.stop - 1}: "
            f"put hosts on the outermost batch axis (mesh.data)"
        )


#: Bytes this process has sent to the others through :func:`gather_numbers` (the step's
#: ``hosts/exchanged_bytes``: numbers, never rows).
EXCHANGED = [0]


def gather_numbers(values: Any) -> np.ndarray:
    """``[processes, ...]``: every process's ``values`` (a small float or int array of the same
    shape everywhere: metrics, counts) on every process, in process order, by one device
    collective (``jax.experimental.multihost_utils.process_allgather``). The only thing a
    host-local step sends between hosts outside its programs: numbers, not rows. Every
    process must call it at the same point (the main thread)."""
    x = np.ascontiguousarray(values)
    if jax.process_count() == 1:
        return x[None]
    EXCHANGED[0] += x.nbytes
    from jax.experimental import multihost_utils

    # as bytes: a float64 or int64 would pass through JAX as 32 bits (x64 off)
    raw = np.frombuffer(x.tobytes(), np.uint8)
    out = np.asarray(multihost_utils.process_allgather(raw, tiled=False))
    return np.ascontiguousarray(out).view(x.dtype).reshape((out.shape[0], *x.shape))


def gather_strings(text: str) -> list[str]:
    """Every process's ``text`` (short: metric names), in process order, on every process:
    two :func:`gather_numbers` (the lengths, then the bytes padded to the longest)."""
    data = text.encode()
    if jax.process_count() == 1:
        return [text]
    width = int(gather_numbers(np.int64(len(data))).max())
    raw = np.zeros(width, np.uint8)
    raw[: len(data)] = np.frombuffer(data, np.uint8)
    return [bytes(row).rstrip(b"\0").decode() for row in gather_numbers(raw)]


def to_host(tree: Any) -> Any:
    """Global arrays split over processes gathered whole onto every process (numpy);
    replicated and single-process leaves pass unchanged."""
    from jax.experimental import multihost_utils

    def get(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return x

    return jax.tree.map(get, tree)


def on_processes(fn: Any, mesh: Mesh, *, gather: bool, local_rows: bool = False) -> Any:
    """``fn`` (a jitted program) callable with host batches on a mesh spanning processes.

    ``local_rows=False``: every process passes the whole batch (:func:`to_global`); with
    ``gather`` the outputs come back whole on every process (:func:`to_host`).
    ``local_rows=True`` (host-local batches, the online loop): every process passes its own
    rows (:func:`rows_to_global`); with ``gather`` the per-row outputs come back as this
    process's rows (:func:`rows_to_local`). Without ``gather`` the outputs stay global
    arrays. ``fn`` itself on one process."""
    if jax.process_count() == 1:
        return fn
    enter = (
        functools.partial(rows_to_global, mesh=mesh)
        if local_rows
        else functools.partial(to_global, mesh=mesh)
    )
    leave = rows_to_local if local_rows else to_host

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        out = fn(*enter(args), **enter(kwargs))
        return leave(out) if gather else out

    return wrapped


def over_processes(fn: Any) -> Any:
    """``fn`` (arrays → arrays, jnp) applied to the whole batch that host-local rows make:
    each process passes its own rows (``[n, ...]``; None and scalars pass), ``fn`` runs once
    as a program on the global arrays (:func:`rows_to_global` over :func:`process_mesh`:
    batch-level means and variances are the whole batch's, by the program's collectives),
    and each process gets back its rows of the result (a scalar whole). ``fn`` itself on one
    process. Every process must call it at the same point."""
    if jax.process_count() == 1:
        return fn
    program = jax.jit(fn)

    @functools.wraps(fn)
    def wrapped(*args):
        return rows_to_local(program(*rows_to_global(args)))

    return wrapped


def take_rows(
    tree: Any, index: np.ndarray, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> Any:
    """Rows ``index`` (global positions, the same on every process) of global arrays split
    by rows (host-local batches), split by rows over ``mesh``'s batch axes again: a program
    whose collectives bring each device its rows from whichever host holds them (a
    minibatch drawn from the whole step's rows, as one process would draw it). Scalars
    pass."""
    idx = np.asarray(index, np.int32)
    rep = replicated(mesh)
    where = jax.make_array_from_callback(idx.shape, rep, lambda i: idx[i])
    return _take(batch_sharding(mesh, rules))(tree, where)


@functools.cache
def _take(rows: NamedSharding) -> Any:
    def take(tree, where):
        return jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x[where], rows) if x.ndim else x, tree
        )

    return jax.jit(take)


def agree_width(batch: dict[str, Any], *, pad_id: int = 0) -> dict[str, Any]:
    """A host-local batch (``input_ids [n, T]`` and leaves of the same T) left-padded to the
    widest T of every process's, so that the rows meet in one global array: ``input_ids``
    with ``pad_id``, the rest (masks) with 0 (masked: no result changes). Unchanged on one
    process."""
    if jax.process_count() == 1:
        return batch
    t = int(np.shape(batch["input_ids"])[1])
    width = int(gather_numbers(np.int64(t)).max())
    if width == t:
        return batch

    def pad(key: str, x: Any) -> Any:
        x = np.asarray(x)
        if x.ndim < 2 or x.shape[1] != t:
            return x
        fill = pad_id if key == "input_ids" else 0
        return np.pad(x, ((0, 0), (width - t, 0)) + ((0, 0),) * (x.ndim - 2), constant_values=fill)

    return {k: pad(k, v) for k, v in batch.items()}
