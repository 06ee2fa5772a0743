"""Multi-host set-up: joining a job (``initialize_distributed``, its start-up faults in one
line), the watch on the other processes (``watch_peers``), and finding a job a launcher
started (``detected_cluster``). How rows and numbers move between hosts once the job runs:
:mod:`jaxrl_llm.parallel.host_rows`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

import jax
import numpy as np

from jaxrl_llm.errors import ConfigError, TrainingError

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
    from jaxrl_llm.parallel.peers import PeerWatch

    kwargs = {} if checkpoints is None else {"checkpoints": checkpoints}
    try:
        return PeerWatch(
            jax.process_index(),
            jax.process_count(),
            _JOB["host"],
            _JOB["failure_timeout_s"],
            _exchange_through_jax,
            port=_env_int(ENV_WATCH_PORT) or 0,
            **kwargs,
        )
    except OSError as e:  # a process that never connected, a port the network blocks
        raise TrainingError(
            f"process {jax.process_index()}: the watch on the job's other processes could not "
            f"start ({e.strerror or e}); process 0's host must accept TCP connections from "
            f"every host on {_JOB['host']}, port {os.environ.get(ENV_WATCH_PORT) or 'any'} "
            f"({ENV_WATCH_PORT} picks it)"
        ) from None


#: Environment variable naming the port process 0's peer watch listens on (default: one the
#: system picks), for a network that opens only named ports.
ENV_WATCH_PORT = "JAXRL_LLM_WATCH_PORT"


#: bytes of the broadcast holding "PORT SECRET_HEX" (5 + 1 + 64)
_WATCH_BYTES = 96


def _exchange_through_jax(value: str | None) -> str:
    """The peer watch's address and secret, from process 0 to the others over the job's own
    devices (:func:`jax.experimental.multihost_utils.broadcast_one_to_all`: only the job's
    processes take part). Every process calls it once at start-up, process 0 with the value."""
    from jax.experimental import multihost_utils

    raw = np.zeros(_WATCH_BYTES, np.uint8)
    if value is not None:
        data = value.encode()
        raw[: len(data)] = np.frombuffer(data, np.uint8)
    try:
        out = multihost_utils.broadcast_one_to_all(raw, is_source=value is not None)
    except Exception as e:  # XlaRuntimeError: a process gone before the watch started
        raise OSError(f"process 0 did not publish its watch ({str(e).splitlines()[0]})") from None
    return bytes(np.asarray(out, np.uint8)).rstrip(b"\0").decode()


#: Environment variables by which a launcher announces a multi-process job that
#: ``jax.distributed.initialize()`` can detect by itself: Cloud TPU pod slices (several
#: workers), SLURM (several tasks), Open MPI (several ranks).
CLUSTER_ENV = {
    "TPU_WORKER_HOSTNAMES": lambda v: "," in v,
    "SLURM_NTASKS": lambda v: v.isdigit() and int(v) > 1,
    "OMPI_COMM_WORLD_SIZE": lambda v: v.isdigit() and int(v) > 1,
}


def preemption_notice(step: int) -> bool:
    """Whether the job has reached JAX's preemption sync point at ``step``
    (:func:`jax.experimental.multihost_utils.reached_preemption_sync_point`): a process was
    told of a preemption and every process is to stop at this same step. Every process must
    call it at every step, from the same first step. False on one process, or where JAX's
    preemption service is off (``jax_enable_preemption_service``).

    In jax 0.10.2 the notice comes from a SIGTERM caught by the handler that
    ``jax.distributed.initialize`` installs (XLA's ``SigtermNotifier``); a run's own SIGTERM
    handler (:func:`jaxrl_llm.train.run.signals.stop_signals`) replaces it for the run's
    length, so this fires for a SIGTERM that lands between joining the job and the run's
    start (which that handler would otherwise swallow: the process would not stop)."""
    if jax.process_count() == 1:
        return False
    from jax.experimental import multihost_utils

    try:
        return bool(multihost_utils.reached_preemption_sync_point(step))
    except RuntimeError:  # the preemption service is off
        return False


def detected_cluster() -> str | None:
    """The variable that shows this process is one of a detectable multi-process job, or
    None (a single-host run: ``jax.distributed`` is not started)."""
    for name, is_multi in CLUSTER_ENV.items():
        value = os.environ.get(name, "")
        if value and is_multi(value):
            return name
    return None
