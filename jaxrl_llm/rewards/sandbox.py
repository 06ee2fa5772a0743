"""Run model-written Python against tests, with a verdict the code cannot reach or forge.

**How a run works.** The candidate's code runs in one process (the *solution*); the tests run
in another (the *judge*), started from the same trusted bootstrap but never running a line of
candidate code. The judge's names for the solution's functions, classes and objects are
proxies: a call sends plain arguments over a socket, the solution computes, and only plain
built-in values (exact types, decoded strictly) come back. The judge compares them with its
own, untouched builtins and reports the verdict through a pipe the solution never had. So
nothing the candidate does to its own interpreter (frames, ``gc``, ``builtins``, ``compile``,
``AssertionError``, ``unittest``, ``sys.exit``, stdout) reaches the verdict, and an object
whose ``__eq__`` is always True cannot pass ``assert f(x) == 3``: the judge never holds it.

**What a test string means** (``tests``, one per data-set row): Python source executed top
to bottom in the judge, in a fresh ``__main__`` namespace that starts with one binding per
global name the solution defined, except names starting with ``__`` and names of built-ins
(``len``, ``sorted``, ``AssertionError`` stay the judge's own); a standard-library module name
that the tests use as ``name.attr`` (``math.isclose``) is always the real module, whatever the
solution bound to it:

* plain values (None, bool, int, float, complex, str, bytes, bytearray, and list, tuple,
  dict, set, frozenset of plain values) are copied; instances of subclasses of these built-in
  types arrive as their built-in contents (a namedtuple as a tuple, a Counter as a dict);
* modules are imported again by name in the judge (``math`` stays usable if the solution
  imported it); the solution's exception classes become judge-side exception classes of the
  same name and nearest built-in base, so ``except MyError`` works;
* everything else (functions, classes, instances, generators) is a proxy: calls, attribute
  reads and writes, ``[]``, ``len``, ``in``, iteration and ``str`` run in the solution, whose
  results come back as plain values or proxies. A proxy has no truth value, no ordering or
  arithmetic, and is equal only to itself: write ``assert f(x) == 3``, not
  ``assert f(x)`` on an object; compare plain values.
* Arguments must be plain values or proxies (a lambda written in the tests cannot be sent).
  A list, dict, set or bytearray passed directly as a positional argument is updated in place
  after the call (copy-in / copy-out), so ``sort_in_place(xs); assert xs == [1, 2]`` works.
* An exception raised by the solution is re-raised in the judge as the built-in exception of
  the same class name, the solution's own exception class, or ``SolutionError``.
* The run passes when the solution's top level ran to its end and the test source then ran to
  its end without raising. ``AssertionError`` gives ``failed_tests``; anything else ``error``.
  The solution runs as a module named ``solution`` (an ``if __name__ == "__main__":`` block is
  skipped); without tests (``tests=None``) it runs as ``__main__`` and passes when it ends.

**Isolation** (:class:`Isolation`), i.e. what contains the solution and the judge:

In ``namespace`` (root) and ``user_namespace`` (any user, where the kernel allows it):

* host files: a fresh tmpfs root with /usr, /lib*, a few /etc files and the interpreter's
  installation bound read-only; homes, checkouts and keys are absent. Writable: /tmp only
  (tmpfs of ``max_file_bytes`` + 1 MiB), with RLIMIT_FSIZE.
* network: a new, empty network namespace. Other processes: a new pid namespace with its own
  /proc; the host's processes (and their environ) are invisible. The bootstrap starts with an
  empty environment.
* privileges: another uid (root host: one for the solution, one for the judge) or, in a user
  namespace, no capabilities; no_new_privs; non-dumpable judge and bootstrap.
* kernel surface: a seccomp deny-list (namespaces, mount, ptrace, process_vm_*, bpf, perf,
  keyrings, io_uring, modules, open_by_handle_at: EPERM; other system-call ABIs: killed).
* leftovers: pid 1 of the namespace exits and the kernel kills everything in it.
* fork, memory, CPU, output: RLIMIT_NPROC, RLIMIT_AS, RLIMIT_CPU + wall clock, output caps.

In ``process`` (opt-in only, no kernel boundary): the same rlimits, privileges and seccomp, a
different uid when root, an empty environment; files, network and same-uid processes are
guarded only by the audit hook (bypassable); the calling (trainer) process is made
non-dumpable when not root, so its /proc/<pid>/environ is unreadable; a subreaper kills the
program's descendants at the end (best effort).

``auto`` picks ``namespace`` when we are root and it works, else ``user_namespace`` when the
kernel allows unprivileged user namespaces, else nothing: running untrusted code without a
boundary needs ``allow_unisolated=True`` (config ``sandbox.allow_unisolated: true``), and
then uses ``process``. The audit hook inside the solution is defence in depth in every mode.

The result of a run is a :class:`SandboxResult`; every failure mode is an :class:`Outcome`
with a short reason, never an exception in the caller.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import enum
import functools
import json
import logging
import os
import re
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

log = logging.getLogger(__name__)

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
    """How the solution and the judge are contained (see the module docstring)."""

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
    return shutil.which("setpriv") is not None and _world_executable(default_interpreter())


def _probe(mode: Isolation) -> bool:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    try:
        r = _run(
            "x = 1\n",
            "assert x == 1\n",
            mode=mode,
            timeout_s=10.0,
            memory_mb=256,
            max_output_bytes=1 << 16,
            max_file_bytes=1 << 20,
            max_procs=16,
            audit_hooks=True,
            python=None,
        )
    except (OSError, ConfigError):
        return False
    if not r.passed:
        log.debug("sandbox: isolation %s unavailable: %s %s", mode.value, r.reason, r.stderr)
    return r.passed


@functools.cache
def namespaces_available() -> bool:
    """Whether ``Isolation.NAMESPACE`` works here: we are root, util-linux ``unshare`` exists
    and a trivial program passes its test inside the namespaces (probed once, cached)."""
    return os.geteuid() == 0 and _probe(Isolation.NAMESPACE)


@functools.cache
def user_namespaces_available() -> bool:
    """Whether ``Isolation.USER_NAMESPACE`` works here (unprivileged user namespaces enabled,
    e.g. ``kernel.unprivileged_userns_clone`` / AppArmor allow them; probed once, cached)."""
    return _probe(Isolation.USER_NAMESPACE)


def resolve_isolation(
    isolation: Isolation | str = Isolation.AUTO, *, allow_unisolated: bool = False
) -> Isolation:
    """The isolation a run will use; raises ConfigError rather than run without a boundary.

    ``auto`` -> ``namespace`` (root) or ``user_namespace`` when they work; otherwise
    ``process`` if ``allow_unisolated`` else ConfigError. Asking for ``process`` also needs
    ``allow_unisolated=True``; asking for a namespace mode that does not work raises.
    Call it at start-up to fail (or warn) early.
    """
    isolation = Isolation(isolation)
    if isolation == Isolation.AUTO:
        if os.geteuid() == 0 and namespaces_available():
            return Isolation.NAMESPACE
        if user_namespaces_available():
            return Isolation.USER_NAMESPACE
        if allow_unisolated:
            return Isolation.PROCESS
        raise ConfigError(
            "sandbox: no isolation boundary works on this machine (namespaces need root, and "
            "unprivileged user namespaces are disabled or util-linux `unshare` is missing); "
            "untrusted code would run as this user. Enable user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1 / kernel.apparmor_restrict_"
            "unprivileged_userns=0), run as root, or set sandbox.allow_unisolated: true "
            "(allow_unisolated=True) to accept the risk"
        )
    if isolation == Isolation.NAMESPACE and not namespaces_available():
        raise ConfigError(
            "sandbox: isolation='namespace' needs root and a working `unshare` "
            "(util-linux); use 'user_namespace' or 'auto'"
        )
    if isolation == Isolation.USER_NAMESPACE and not user_namespaces_available():
        raise ConfigError(
            "sandbox: isolation='user_namespace' is unavailable here "
            "(unprivileged user namespaces disabled, or no `unshare`)"
        )
    if isolation == Isolation.PROCESS and not allow_unisolated:
        raise ConfigError(
            "sandbox: isolation='process' is no security boundary; pass "
            "allow_unisolated=True (config sandbox.allow_unisolated: true)"
        )
    return isolation


def _world_executable(path: str) -> bool:
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
    if os.geteuid() != 0 or _world_executable(sys.executable):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and _world_executable(candidate):
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


def _run(
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
    and judges what it reported; the arguments are :func:`run_python`'s, checked."""
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


def run_python(
    code: str,
    *,
    tests: str | None = None,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_bytes: int = 1 << 20,
    max_file_bytes: int = 16 << 20,
    max_procs: int = 16,
    isolation: Isolation | str = Isolation.AUTO,
    audit_hooks: bool = True,
    python: str | None = None,
    allow_unisolated: bool = False,
) -> SandboxResult:
    """Runs ``code`` in a contained solution process and judges it with ``tests`` elsewhere.

    See the module docstring for what a test string means (the judge's namespace, proxies,
    plain values) and what each isolation mode enforces. Never raises for anything the
    program does; raises ConfigError for bad limits or when no isolation boundary is available
    and ``allow_unisolated`` is False.

    Args:
      code: Python source of the solution.
      tests: Python source run by the judge against the solution's names, or None (then the
        run passes when the solution's code runs to its end).
      timeout_s: wall-clock limit of the whole run; CPU-time limit ``int(timeout_s) + 2`` s.
      memory_mb: address-space limit of the solution and of the judge (RLIMIT_AS).
      max_output_bytes: cap for stdout and for stderr each; exceeding it kills the run.
      max_file_bytes: largest file the program may write (RLIMIT_FSIZE; also the tmpfs size).
      max_procs: process/thread limit (RLIMIT_NPROC).
      isolation: :class:`Isolation`; see :func:`resolve_isolation`.
      audit_hooks: install the in-interpreter audit hook in the solution (defence in depth).
      python: interpreter path; default: this one (namespace modes) or
        :func:`default_interpreter` (``process`` mode).
      allow_unisolated: accept running without a kernel boundary when none is available
        (``auto``) or when ``process`` is asked for. Off by default.

    Returns:
      A :class:`SandboxResult`; ``passed`` is True only if the judge, a process the solution
      cannot reach, saw every test hold.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes <= 0 or max_procs <= 0:
        raise ConfigError(
            "run_python: timeout_s, memory_mb, max_output_bytes and max_procs must be positive"
        )
    mode = resolve_isolation(isolation, allow_unisolated=allow_unisolated)
    return _run(
        code,
        tests,
        mode=mode,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_file_bytes=max_file_bytes,
        max_procs=max_procs,
        audit_hooks=audit_hooks,
        python=python,
    )


_CODE_BLOCK = re.compile(r"```(?:python|py|Python|python3)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_python_code(text: str) -> str | None:
    """The last fenced code block (```python ... ```, or an unlabelled one) in ``text``, or None.

    The last block is taken because models usually revise a first attempt.
    """
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


def code_execution_reward(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    tests: Sequence[str | None],
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_workers: int = 4,
    isolation: Isolation | str = Isolation.AUTO,
    allow_unisolated: bool = False,
    **_fields,
) -> list[float | None]:
    """Unit-test pass reward: 1.0 if the completion's last ```python block passes ``tests``.

    r_i = 1[code_i runs and every assertion of tests_i holds], as in the execution-based
    rewards of CodeRL (Le et al. 2022, https://arxiv.org/abs/2207.01780) and the verifiable
    code rewards of DeepSeek-R1 (https://arxiv.org/abs/2501.12948). A completion without a
    code block, a failing test, a timeout, a memory or output violation all give 0.0; a
    sample whose ``tests`` field is None gets None (no score). Samples run concurrently in a
    small thread pool (each in its own sandbox). The tests are judged in a process that never
    runs the completion's code (see the module docstring for what a test string may use), so
    a completion cannot forge a pass by patching its interpreter, exiting early, printing, or
    returning objects whose ``__eq__`` always holds. Raises ConfigError when no isolation
    boundary works here and ``allow_unisolated`` is False.

    Args:
      prompts: N prompts (unused; part of the reward interface).
      completions: N completions.
      tests: N test sources (the data set's ``tests`` column), or None per sample.
      timeout_s, memory_mb, isolation, allow_unisolated: passed to :func:`run_python`.
      max_workers: concurrent sandboxes.

    Returns:
      N floats in {0.0, 1.0} (or None). Use :func:`code_execution_details` for the reasons.
    """
    return [
        None if r is None else float(r.passed)
        for r in code_execution_details(
            completions,
            tests=tests,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_workers=max_workers,
            isolation=isolation,
            allow_unisolated=allow_unisolated,
        )
    ]


def code_execution_details(
    completions: Sequence[str],
    *,
    tests: Sequence[str | None],
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_workers: int = 4,
    isolation: Isolation | str = Isolation.AUTO,
    allow_unisolated: bool = False,
) -> list[SandboxResult | None]:
    """Runs every completion's code block against its tests; one :class:`SandboxResult` each.

    Args:
      completions: N completions. tests: N test sources or None (then the result is None).
      timeout_s, memory_mb, isolation, allow_unisolated: passed to :func:`run_python`.
      max_workers: concurrent sandboxes (threads, each waiting on its own child process).

    Returns:
      N results (``reason == "no_code"`` when the completion has no code block).
    """
    if len(tests) != len(completions):
        raise ConfigError(
            f"code_execution_reward: field 'tests' has {len(tests)} entries for "
            f"{len(completions)} completions; they must be aligned"
        )
    # Resolved once, up front: no boundary and no opt-in is an error for the whole batch.
    isolation = resolve_isolation(isolation, allow_unisolated=allow_unisolated)

    def one(i: int) -> SandboxResult | None:
        if tests[i] is None:
            return None
        code = extract_python_code(completions[i])
        if code is None:
            return SandboxResult(False, Outcome.NO_CODE.value, "", "", None, 0.0)
        return run_python(
            code,
            tests=tests[i],
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            isolation=isolation,
            allow_unisolated=allow_unisolated,
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        return list(pool.map(one, range(len(completions))))
