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
import functools
import logging
import os
import re
import shutil
import sys
from collections.abc import Sequence

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.rewards.sandbox_launch import (
    Isolation,
    Outcome,
    SandboxResult,
    default_interpreter,  # noqa: F401  (public here too)
    launch,
)

log = logging.getLogger(__name__)


def _probe(mode: Isolation) -> bool:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    try:
        r = launch(
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
    return launch(
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
