"""Run model-written Python against tests in a contained child process.

What is enforced, and where (``Isolation.NAMESPACE``, used when we are root and util-linux
``unshare`` works, as in our containers and most CI runners):

| threat | kernel / process level | inside the interpreter (audit hook) |
|---|---|---|
| infinite loop | wall-clock timeout kills the process group; RLIMIT_CPU | – |
| fork bomb | new PID namespace (dies with its init), RLIMIT_NPROC for a unique non-root uid | – |
| memory bomb | RLIMIT_AS (MemoryError → reason ``memory``) | – |
| huge output | parent reads at most ``max_output_bytes`` then kills; RLIMIT_FSIZE; tmpfs size | – |
| network | new, empty network namespace (no interface is up) | connect/bind refused |
| writes outside cwd | non-root uid, root file system remounted read-only, private tmpfs /tmp | refused |
| parent's environment | child gets a fresh, minimal environment; ``python -I`` ignores PYTHON* | – |
| signalling the parent | different uid, parent invisible from the PID namespace | refused |

``Isolation.PROCESS`` (fallback when namespaces are unavailable, e.g. an unprivileged user on
a laptop): a new session, the same rlimits, a fresh temporary directory, a clean environment,
a non-root uid if we are root, and a stricter audit hook that also refuses starting processes
and loading ctypes. Audit hooks are not a security boundary against native code; use the
namespace mode (or a VM) for untrusted code at scale.

The result of a run is a :class:`SandboxResult`; every failure mode is a :class:`Outcome`
with a short reason, never an exception in the caller.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import functools
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.rewards._boot import BOOT_SOURCE


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
    """How the child is contained (see the module docstring)."""

    AUTO = "auto"  # NAMESPACE when available, else PROCESS
    NAMESPACE = "namespace"
    PROCESS = "process"


@dataclasses.dataclass(frozen=True, slots=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    Attributes:
      passed: the program and all tests ran to the end without error.
      reason: an :class:`Outcome` value (``"passed"``, ``"timeout"``, ``"memory"``, ...).
      stdout, stderr: decoded output, each at most ``max_output_bytes`` bytes.
      returncode: the child's exit status (negative: killed by that signal; None: not started).
      duration_s: wall-clock seconds of the run.
    """

    passed: bool
    reason: str
    stdout: str
    stderr: str
    returncode: int | None
    duration_s: float


_EXIT_REASON = {10: Outcome.ERROR, 11: Outcome.FAILED_TESTS, 12: Outcome.ERROR,
                13: Outcome.MEMORY, 14: Outcome.ERROR, 15: Outcome.SANDBOX_ERROR}
_SIGNAL_REASON = {signal.SIGXCPU: Outcome.TIMEOUT, signal.SIGXFSZ: Outcome.OUTPUT_LIMIT}


# Each concurrent run gets its own uid so one run's processes count neither against another's
# RLIMIT_NPROC nor can signal it. The base mixes in our pid so two host processes rarely share.
_UID_BASE = 200_000 + (os.getpid() % 4096) * 64
_uid_lock = threading.Lock()
_free_uids = list(range(_UID_BASE, _UID_BASE + 64))


def _take_uid() -> int:
    with _uid_lock:
        if not _free_uids:
            raise ConfigError("sandbox: more than 64 concurrent runs; lower max_workers")
        return _free_uids.pop()


def _give_uid(uid: int) -> None:
    with _uid_lock:
        _free_uids.append(uid)


@functools.cache
def namespaces_available() -> bool:
    """Whether the namespace isolation works here (root, util-linux ``unshare``, kernel support)."""
    exe = shutil.which("unshare")
    if exe is None or os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return False
    try:
        r = subprocess.run([exe, *_UNSHARE_FLAGS, "true"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


_UNSHARE_FLAGS = ("--fork", "--pid", "--net", "--mount", "--mount-proc", "--kill-child", "--")


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
    """The Python used for sandboxed programs: ours if another uid may run it, else /usr/bin's."""
    if os.geteuid() != 0 or _world_executable(sys.executable):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and _world_executable(candidate):
            return candidate
    return sys.executable


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
) -> SandboxResult:
    """Runs ``code`` and then ``tests`` (same globals) in a contained child Python.

    The program is ``solution.py`` and the tests ``tests.py`` in a fresh working directory that
    is deleted afterwards; both run under ``python -I -S -B`` (no site-packages, no user
    environment). Tests are plain Python (typically ``assert f(2) == 4``); an
    ``AssertionError`` gives ``failed_tests``, any other exception ``error``. Never raises for
    anything the program does; see the module docstring for what is enforced where.

    Args:
      code: Python source of the solution.
      tests: Python source run after ``code`` in the same namespace, or None.
      timeout_s: wall-clock limit; the CPU-time limit is ``int(timeout_s) + 2`` seconds.
      memory_mb: address-space limit of the program (RLIMIT_AS).
      max_output_bytes: cap for stdout and for stderr each; exceeding it kills the run.
      max_file_bytes: largest file the program may write (RLIMIT_FSIZE; also the tmpfs size).
      max_procs: process/thread limit of the sandbox uid (RLIMIT_NPROC).
      isolation: :class:`Isolation`; ``namespace`` raises ConfigError if unavailable.
      audit_hooks: install the in-interpreter audit hook (defence in depth).
      python: interpreter path; default :func:`default_interpreter`.

    Returns:
      A :class:`SandboxResult`; ``passed`` is True only if the bootstrap confirmed (with a
      per-run random token on stdout) that every line of code and tests ran.
    """
    isolation = Isolation(isolation)
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes <= 0 or max_procs <= 0:
        raise ConfigError("run_python: timeout_s, memory_mb, max_output_bytes and max_procs "
                          "must be positive")
    if isolation == Isolation.AUTO:
        isolation = Isolation.NAMESPACE if namespaces_available() else Isolation.PROCESS
    elif isolation == Isolation.NAMESPACE and not namespaces_available():
        raise ConfigError("run_python: isolation='namespace' needs root and a working "
                          "`unshare` (util-linux); use isolation='process' or 'auto'")
    isolated = isolation == Isolation.NAMESPACE
    nonce = secrets.token_hex(16)
    uid = _take_uid() if os.geteuid() == 0 else None
    workdir = None if isolated else tempfile.mkdtemp(prefix="jaxrl_sandbox_")
    if workdir is not None and uid is not None:
        os.chown(workdir, uid, uid)
    cfg = dict(code=code, tests=tests, nonce=nonce, uid=uid, isolated=isolated, workdir=workdir,
               cpu_s=int(timeout_s) + 2, memory_bytes=int(memory_mb) << 20,
               fsize_bytes=int(max_file_bytes), disk_mb=max(1, (int(max_file_bytes) >> 20) + 1),
               max_procs=int(max_procs), hooks=bool(audit_hooks))
    interp = python or default_interpreter()
    cmd = [interp, "-I", "-S", "-B", "-c", BOOT_SOURCE]
    if isolated:
        cmd = [shutil.which("unshare"), *_UNSHARE_FLAGS, *cmd]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    start = time.monotonic()
    out, err = bytearray(), bytearray()
    over = threading.Event()
    timed_out = False
    try:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, cwd=workdir or "/",
                                    start_new_session=True, close_fds=True)
        except OSError as e:
            return SandboxResult(False, Outcome.SANDBOX_ERROR.value, "", f"cannot start: {e}",
                                 None, time.monotonic() - start)
        readers = [threading.Thread(target=_reader, args=(s, max_output_bytes, b, over),
                                    daemon=True) for s, b in ((proc.stdout, out), (proc.stderr, err))]
        for t in readers:
            t.start()
        try:
            proc.stdin.write(json.dumps(cfg).encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        deadline = start + timeout_s
        while True:
            try:
                proc.wait(timeout=0.02)
                break
            except subprocess.TimeoutExpired:
                pass
            if over.is_set():
                _kill_group(proc)
                break
            if time.monotonic() > deadline:
                timed_out = True
                _kill_group(proc)
                break
        _kill_group(proc)  # leftovers of the group (PROCESS mode); no-op if all is gone
        proc.wait()
        for t in readers:
            t.join(timeout=1.0)
        for s in (proc.stdout, proc.stderr):
            s.close()
    finally:
        if uid is not None:
            _give_uid(uid)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    duration = time.monotonic() - start
    rc = proc.returncode
    stdout = bytes(out).decode("utf-8", "replace")
    stderr = bytes(err).decode("utf-8", "replace")
    marker = "\n" + nonce + "\n"
    confirmed = stdout.endswith(marker)
    if confirmed:
        stdout = stdout[: -len(marker)]
    if isolated and rc is not None and rc > 128:
        rc = -(rc - 128)  # the namespace init reports the program's signal as 128 + n
    if timed_out:
        reason = Outcome.TIMEOUT
    elif over.is_set():
        reason = Outcome.OUTPUT_LIMIT
    elif rc == 0:
        reason = Outcome.PASSED if confirmed else Outcome.ERROR
    elif rc is not None and rc < 0:
        reason = _SIGNAL_REASON.get(-rc, Outcome.ERROR)
    else:
        reason = _EXIT_REASON.get(rc, Outcome.ERROR)
    if reason == Outcome.ERROR and "MemoryError" in stderr:
        reason = Outcome.MEMORY
    return SandboxResult(passed=reason == Outcome.PASSED, reason=reason.value, stdout=stdout,
                         stderr=stderr, returncode=rc, duration_s=duration)


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
    **_fields,
) -> list[float | None]:
    """Unit-test pass reward: 1.0 if the completion's last ```python block passes ``tests``.

    r_i = 1[code_i runs and every assertion of tests_i holds], as in the execution-based
    rewards of CodeRL (Le et al. 2022, https://arxiv.org/abs/2207.01780) and the verifiable
    code rewards of DeepSeek-R1 (https://arxiv.org/abs/2501.12948). A completion without a
    code block, a failing test, a timeout, a memory or output violation all give 0.0; a
    sample whose ``tests`` field is None gets None (no score). Samples run concurrently in a
    small thread pool (each in its own sandbox process).

    Args:
      prompts: N prompts (unused; part of the reward interface).
      completions: N completions.
      tests: N test sources (the data set's ``tests`` column), or None per sample.
      timeout_s, memory_mb, isolation: passed to :func:`run_python`.
      max_workers: concurrent sandboxes.

    Returns:
      N floats in {0.0, 1.0} (or None). Use :func:`code_execution_details` for the reasons.
    """
    return [None if r is None else float(r.passed)
            for r in code_execution_details(completions, tests=tests, timeout_s=timeout_s,
                                            memory_mb=memory_mb, max_workers=max_workers,
                                            isolation=isolation)]


def code_execution_details(
    completions: Sequence[str],
    *,
    tests: Sequence[str | None],
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_workers: int = 4,
    isolation: Isolation | str = Isolation.AUTO,
) -> list[SandboxResult | None]:
    """Runs every completion's code block against its tests; one :class:`SandboxResult` each.

    Args:
      completions: N completions. tests: N test sources or None (then the result is None).
      timeout_s, memory_mb, isolation: passed to :func:`run_python`.
      max_workers: concurrent sandboxes (threads, each waiting on its own child process).

    Returns:
      N results (``reason == "no_code"`` when the completion has no code block).
    """
    if len(tests) != len(completions):
        raise ConfigError(f"code_execution_reward: field 'tests' has {len(tests)} entries for "
                          f"{len(completions)} completions; they must be aligned")

    def one(i: int) -> SandboxResult | None:
        if tests[i] is None:
            return None
        code = extract_python_code(completions[i])
        if code is None:
            return SandboxResult(False, Outcome.NO_CODE.value, "", "", None, 0.0)
        return run_python(code, tests=tests[i], timeout_s=timeout_s, memory_mb=memory_mb,
                          isolation=isolation)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        return list(pool.map(one, range(len(completions))))
