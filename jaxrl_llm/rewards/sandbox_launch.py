"""One sandboxed run on the host: the boot program's command line, its start, inputs,
output and teardown, and the :class:`SandboxResult` made from what it reported.

:mod:`jaxrl_llm.rewards.sandbox` is the public side (what a run means, which isolation,
:func:`~jaxrl_llm.rewards.sandbox.run_python`); :func:`launch` here starts the trusted
bootstrap (``_sandbox_boot.py`` and its parts, joined into one program) under ``unshare`` /
``setpriv`` or as a plain child, gives each run its own uids when we are root, feeds it the
config and the tests, caps its output, enforces the wall clock and kills whatever is left.
The names both sides use are defined here: :class:`Isolation`, :class:`Outcome`,
:class:`SandboxResult` and :func:`default_interpreter`.

Standard library and :mod:`jaxrl_llm.errors` only (``tests/rewards/test_sandbox_hostile.py``
loads it by path in an interpreter without the package's dependencies).
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import functools
import json
import logging
import os
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from jaxrl_llm.errors import ConfigError

# The public module's logger: the sandbox's messages keep one logger name.
log = logging.getLogger("jaxrl_llm.rewards.sandbox")

# The program the sandbox starts (``python -I -S -B -c``): its parts joined into one text, boot
# first, then the call of boot's main() (see _sandbox_boot.py's docstring).
_BOOT_PARTS = (
    "_sandbox_boot.py",
    "_sandbox_wire.py",
    "_sandbox_confine.py",
    "_sandbox_solution.py",
    "_sandbox_judge.py",
)
_BOOT_SOURCE = (
    "\n\n".join(Path(__file__).with_name(part).read_text() for part in _BOOT_PARTS) + "\n\nmain()\n"
)


class Outcome(str, enum.Enum):
    """Why a sandboxed run ended (``SandboxResult.reason``)."""

    PASSED = "passed"
    FAILED_TESTS = "failed_tests"  # a test assertion failed
    ERROR = "error"  # the solution or the tests raised, or the program exited early
    TIMEOUT = "timeout"  # wall-clock or CPU time limit
    MEMORY = "memory"  # address-space limit (MemoryError)
    OUTPUT_LIMIT = "output_limit"  # stdout/stderr or file-size limit
    NO_CODE = "no_code"  # no code block found in the completion
    SANDBOX_ERROR = "sandbox_error"  # the sandbox itself could not start


class Isolation(str, enum.Enum):
    """How the solution and the judge are contained (see :mod:`jaxrl_llm.rewards.sandbox`)."""

    AUTO = "auto"  # NAMESPACE if root and it works, else USER_NAMESPACE, else refuse
    NAMESPACE = "namespace"  # root: pid/net/mount/ipc/uts namespaces, sandbox uids
    USER_NAMESPACE = "user_namespace"  # any user: the same inside an unprivileged user ns
    PROCESS = "process"  # no kernel boundary; only with allow_unisolated=True


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    Attributes:
      passed: the solution ran to its end and every test held (judged outside the solution).
      reason: an :class:`Outcome` value (``"passed"``, ``"timeout"``, ``"memory"``, ...).
      stdout, stderr: decoded output of the solution and the judge, each at most
        ``max_output_bytes`` bytes (never used for the verdict).
      returncode: the solution process's exit status if it ended by itself (negative: killed
        by that signal), 0 if it was still answering the judge when the run ended, None if it
        did not start.
      duration_s: wall-clock seconds of the run.
    """

    passed: bool
    reason: str
    stdout: str
    stderr: str
    returncode: int | None
    duration_s: float


_SIGNAL_REASON = {
    signal.SIGXCPU: Outcome.TIMEOUT,
    signal.SIGXFSZ: Outcome.OUTPUT_LIMIT,
    signal.SIGKILL: Outcome.ERROR,
}
_EXIT_REASON = {13: Outcome.MEMORY, 15: Outcome.SANDBOX_ERROR}

# Each concurrent run (root host) gets two uids of its own, one for the solution and one for
# the judge, so one run's processes neither count against another's RLIMIT_NPROC nor can
# signal it or each other. The base mixes in our pid so two host processes rarely share.
_UID_BASE = 200_000 + (os.getpid() % 2048) * 128
_uid_lock = threading.Lock()
_free_uids = list(range(_UID_BASE, _UID_BASE + 128, 2))


def _take_uids() -> list[int]:
    with _uid_lock:
        if not _free_uids:
            raise ConfigError("sandbox: more than 64 concurrent runs; lower max_workers")
        u = _free_uids.pop()
        return [u, u + 1]


def _give_uids(uids: list[int]) -> None:
    with _uid_lock:
        _free_uids.append(uids[0])


_NS_FLAGS = ("--fork", "--pid", "--net", "--mount", "--ipc", "--uts", "--kill-child")


def _command(mode: Isolation, interp: str, setpriv_uid: int | None) -> list[str]:
    boot = [interp, "-I", "-S", "-B", "-c", _BOOT_SOURCE]
    if mode == Isolation.PROCESS:
        return boot
    unshare = shutil.which("unshare") or "unshare"
    if mode == Isolation.NAMESPACE:
        return [unshare, *_NS_FLAGS, "--", *boot]
    cmd = [unshare, "--user", "--map-root-user", *_NS_FLAGS, "--", *boot]
    if setpriv_uid is not None:
        # Root asked for a user namespace: enter it as a sandbox uid, not as root, so that
        # RLIMIT_NPROC holds (the kernel never applies it to the host's root).
        u = str(setpriv_uid)
        cmd = [
            shutil.which("setpriv") or "setpriv",
            "--reuid=" + u,
            "--regid=" + u,
            "--clear-groups",
            *cmd,
        ]
    return cmd


def _setpriv_usable() -> bool:
    return shutil.which("setpriv") is not None and world_executable(default_interpreter())


def world_executable(path: str) -> bool:
    """Can a non-root uid execute ``path`` (every parent directory searchable by others)?"""
    path = os.path.realpath(path)
    if not os.stat(path).st_mode & stat.S_IXOTH:
        return False
    d = os.path.dirname(path)
    while True:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return False
        if d == "/":
            return True
        d = os.path.dirname(d)


@functools.cache
def default_interpreter() -> str:
    """The Python used for sandboxed programs: ours if another uid may run it, else /usr/bin's.

    (Only ``process`` mode as root needs another uid to read the interpreter's files; the
    namespace modes bind its installation into the sandbox's root.)
    """
    if os.geteuid() != 0 or world_executable(sys.executable):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and world_executable(candidate):
            return candidate
    return sys.executable


_made_non_dumpable = False


def _make_self_non_dumpable() -> None:
    """PR_SET_DUMPABLE 0 on this (trainer) process: its /proc/<pid>/environ, mem, fd become
    root-owned, so same-uid code outside a namespace cannot read its secrets. Side effect: no
    core dumps, and debuggers (py-spy, gdb) cannot attach without root."""
    global _made_non_dumpable
    if _made_non_dumpable or os.geteuid() == 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, ctypes.c_ulong(0), 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")
    _made_non_dumpable = True
    log.warning(
        "sandbox: running untrusted code WITHOUT an isolation boundary "
        "(allow_unisolated); this process is now non-dumpable"
    )


def _reader(stream, cap: int, sink: bytearray, over: threading.Event) -> None:
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            return
        room = cap - len(sink)
        if room > 0:
            sink += chunk[:room]
        if len(chunk) > room:
            over.set()
            return


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def _kill_uids(uids: list[int]) -> None:
    """Root host, ``process`` mode: SIGKILL whatever still runs as this run's uids."""
    for _ in range(50):
        found = False
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    if os.stat(f"/proc/{d}").st_uid in uids:
                        os.kill(int(d), signal.SIGKILL)
                        found = True
                except (FileNotFoundError, ProcessLookupError):
                    pass
        if not found:
            return
        time.sleep(0.01)


def _read_summary(sock: socket.socket, wait_s: float) -> dict | None:
    data = bytearray()
    end = time.monotonic() + wait_s
    while len(data) < (1 << 20):
        left = end - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return None
        try:
            chunk = sock.recv(65536)
        except OSError:
            return None
        if not chunk:
            break
        data += chunk
    try:
        summary = json.loads(bytes(data).decode())
    except ValueError:
        return None
    return summary if isinstance(summary, dict) else None


def _outcome(
    summary: dict | None, timed_out: bool, over: bool, stderr: str, boot_rc: int | None
) -> tuple[Outcome, int | None]:
    """(reason, returncode) from what the trusted bootstrap reported."""
    if timed_out or (summary or {}).get("timeout"):
        return Outcome.TIMEOUT, None
    if over:
        return Outcome.OUTPUT_LIMIT, None
    if summary is None:
        return (
            Outcome.SANDBOX_ERROR
            if boot_rc in (15, None) or "sandbox setup failed" in stderr
            else Outcome.ERROR
        ), None
    sol = summary.get("solution") or {}
    rc = 0 if sol.get("killed") else sol.get("exit", -sol.get("signal", 0) or 0)
    verdict = summary.get("verdict")
    if verdict == "passed":
        return Outcome.PASSED, rc
    if verdict == "failed_tests":
        return Outcome.FAILED_TESTS, rc
    if "signal" in sol:
        reason = _SIGNAL_REASON.get(sol["signal"], Outcome.ERROR)
    else:
        reason = _EXIT_REASON.get(sol["exit"], Outcome.ERROR) if "exit" in sol else Outcome.ERROR
    if verdict is None and summary.get("judge") == 15:
        reason = Outcome.SANDBOX_ERROR
    if reason == Outcome.ERROR and (
        "MemoryError" in stderr or str(summary.get("detail", "")).startswith("memory")
    ):
        reason = Outcome.MEMORY
    return reason, rc


def _setpriv_uid(uids: list[int] | None, mode: Isolation) -> int | None:
    """The sandbox uid a root host enters a user namespace as (when setpriv works), else None."""
    if uids is not None and mode == Isolation.USER_NAMESPACE:
        return uids[0] if _setpriv_usable() else None
    return None


def _process_workdir(uids: list[int] | None) -> str:
    """``process`` mode: makes this process non-dumpable; a fresh working directory for the run."""
    _make_self_non_dumpable()
    workdir = tempfile.mkdtemp(prefix="jaxrl_sandbox_")
    if uids is not None:
        os.chown(workdir, uids[0], uids[0])
    return workdir


def _start_boot(cmd: list[str], workdir: str | None, chan: socket.socket) -> subprocess.Popen:
    """Starts the bootstrap in a new session, with pipes, an empty environment and ``chan``."""
    # An empty environment: nothing secret to read from the bootstrap's environ.
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={},
        cwd=workdir or "/",
        start_new_session=True,
        close_fds=True,
        pass_fds=(chan.fileno(),),
    )


def _start_readers(
    streams: Sequence[tuple], cap: int, over: threading.Event
) -> list[threading.Thread]:
    """Started daemon threads copying each (stream, sink) pair, up to ``cap`` bytes each."""
    readers = [
        threading.Thread(target=_reader, args=(s, cap, b, over), daemon=True) for s, b in streams
    ]
    for t in readers:
        t.start()
    return readers


def _send_inputs(to_boot, host_sock: socket.socket, cfg: dict, tests: str | None) -> None:
    """The config to the bootstrap's stdin, then the tests to the host channel (if it listens)."""
    try:
        to_boot.write(json.dumps(cfg).encode())
        to_boot.close()
        if tests is not None:  # after the solution was forked; only the judge reads it
            data = json.dumps(tests).encode()
            host_sock.sendall(struct.pack(">I", len(data)) + data)
        host_sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _wait_boot(proc: subprocess.Popen, over: threading.Event, deadline: float) -> bool:
    """Waits for the bootstrap; kills it on an output overflow or past ``deadline`` (True)."""
    while True:
        try:
            proc.wait(timeout=0.02)
            return False
        except subprocess.TimeoutExpired:
            pass
        if over.is_set():
            _kill_group(proc)
            return False
        if time.monotonic() > deadline:
            _kill_group(proc)
            return True


def _release(
    host_sock: socket.socket, uids: list[int] | None, mode: Isolation, workdir: str | None
) -> None:
    """Closes the host channel, kills and returns the run's uids, removes its working directory."""
    host_sock.close()
    if uids is not None:
        if mode == Isolation.PROCESS:
            _kill_uids(uids)
        _give_uids(uids)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def launch(
    code: str,
    tests: str | None,
    *,
    mode: Isolation,
    timeout_s: float,
    memory_mb: int,
    max_output_bytes: int,
    max_file_bytes: int,
    max_procs: int,
    audit_hooks: bool,
    python: str | None,
) -> SandboxResult:
    """Runs ``code`` (and ``tests``) under ``mode``: starts the bootstrap, feeds it, waits for it
    and judges what it reported; the arguments are
    :func:`~jaxrl_llm.rewards.sandbox.run_python`'s, already checked (``mode`` resolved)."""
    uids = _take_uids() if os.geteuid() == 0 else None
    # Inside a user namespace only one uid is mapped: there the boot gets no sandbox uids.
    setpriv_uid = _setpriv_uid(uids, mode)
    workdir = _process_workdir(uids) if mode == Isolation.PROCESS else None
    host_sock, child_sock = socket.socketpair()
    cfg = dict(
        code=code,
        has_tests=tests is not None,
        mode=mode.value,
        chan=child_sock.fileno(),
        uids=None if mode == Isolation.USER_NAMESPACE else uids,
        workdir=workdir,
        timeout_s=float(timeout_s),
        cpu_s=int(timeout_s) + 2,
        memory_bytes=int(memory_mb) << 20,
        fsize_bytes=int(max_file_bytes),
        disk_mb=max(1, (int(max_file_bytes) >> 20) + 1),
        max_procs=int(max_procs),
        hooks=bool(audit_hooks),
    )
    interp = python or (
        default_interpreter()
        if mode == Isolation.PROCESS or setpriv_uid is not None
        else sys.executable
    )
    start = time.monotonic()
    out, err = bytearray(), bytearray()
    over = threading.Event()
    timed_out = False
    proc = None
    try:
        try:
            proc = _start_boot(_command(mode, interp, setpriv_uid), workdir, child_sock)
        except OSError as e:
            return SandboxResult(
                False,
                Outcome.SANDBOX_ERROR.value,
                "",
                f"cannot start: {e}",
                None,
                time.monotonic() - start,
            )
        finally:
            child_sock.close()
        to_boot, boot_out, boot_err = proc.stdin, proc.stdout, proc.stderr
        assert to_boot is not None and boot_out is not None and boot_err is not None  # PIPEs
        readers = _start_readers(((boot_out, out), (boot_err, err)), max_output_bytes, over)
        _send_inputs(to_boot, host_sock, cfg, tests)
        deadline = start + timeout_s + 1.0  # the bootstrap enforces timeout_s itself
        timed_out = _wait_boot(proc, over, deadline)
        summary = None if (timed_out or over.is_set()) else _read_summary(host_sock, 1.0)
        _kill_group(proc)  # leftovers of the group; no-op if all is gone
        proc.wait()
        for t in readers:
            t.join(timeout=1.0)
        for s in (boot_out, boot_err):
            s.close()
    finally:
        _release(host_sock, uids, mode, workdir)
    duration = time.monotonic() - start
    stdout = bytes(out).decode("utf-8", "replace")
    stderr = bytes(err).decode("utf-8", "replace")
    reason, rc = _outcome(summary, timed_out, over.is_set(), stderr, proc.returncode)
    return SandboxResult(
        passed=reason == Outcome.PASSED,
        reason=reason.value,
        stdout=stdout,
        stderr=stderr,
        returncode=rc,
        duration_s=duration,
    )
