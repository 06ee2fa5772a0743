"""The program the code sandbox starts: ``python -I -S -B -c <text>``; never imported.

The text is this file followed by the other parts of the program, joined by
``sandbox_launch.py`` in this order, then a call of :func:`main`:

  _sandbox_boot.py       boot: forks the solution and the judge, waits, reports (this file)
  _sandbox_wire.py       the wire format between the judge and the solution
  _sandbox_confine.py    kernel helpers: root filesystem, privileges, seccomp, rlimits
  _sandbox_solution.py   the solution process
  _sandbox_judge.py      the judge process and its proxies

It must not import anything from the host checkout (the sandbox may not be able to read it),
so the parts use the standard library only and, when they run, share one namespace; their
imports of each other sit under ``if TYPE_CHECKING:`` (False there), for readers and the type
checker. No part may define a top-level name that another defines, nor use ``__future__``.

It reads a JSON config on stdin (``{code, mode, chan, has_tests, uids, workdir, limits...,
hooks}``) and the tests, later, from the host channel ``chan`` (an AF_UNIX socket only this
process and the judge ever hold).

Processes (namespace modes: this program is pid 1 of a new pid namespace; ``process`` mode: a
child subreaper of the host):

  boot (trusted, non-dumpable)
   ├─ solution: runs the candidate's code, then answers calls from the judge; it never sees the
   │  tests, the host channel or the verdict pipe (closed before the candidate's code runs);
   │  its privileges are dropped (another uid when we are root, no capabilities in a user
   │  namespace; no new privileges and a seccomp filter in both).
   └─ judge: a second process, forked before any candidate code could touch it, that never
      runs candidate code. It executes the tests
      with proxies standing for the solution's names; every call goes over a socket to the
      solution, and only plain built-in values (exact types) come back. It writes its verdict
      to a pipe that only boot reads. Non-dumpable, so the solution cannot ptrace it or read
      its memory or file descriptors through /proc.

boot writes one JSON summary to the host channel after both are gone:
  ``{"verdict": "passed" | "failed_tests" | "error" | null, "detail": str,
     "solution": {"exit": n} | {"signal": n} | {"killed": true}, "timeout": bool,
     "judge": exit status or -signal or null}``.
Exit status of boot: 0, or 15 when the sandbox itself could not be set up.
"""

import json
import linecache  # noqa: F401  (imported by boot, before any candidate code could touch files)
import os
import signal
import socket
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # the parts share one namespace in the sandbox; these are for the checkers
    from jaxrl_llm.rewards._sandbox_confine import (
        PR_SET_CHILD_SUBREAPER,
        PR_SET_DUMPABLE,
        PR_SET_PDEATHSIG,
        apply_limits,
        build_root,
        close_fds_except,
        drop_privileges,
        prctl,
    )
    from jaxrl_llm.rewards._sandbox_judge import judge_main
    from jaxrl_llm.rewards._sandbox_solution import solution_main
    from jaxrl_llm.rewards._sandbox_wire import recv

_T0 = time.monotonic()


def _read_tests(chan):
    try:
        return recv(chan)
    except Exception:  # noqa: BLE001
        return None


def _kill_all_children(me):
    """SIGKILL every process whose parent is us, until none is left (we are a subreaper or
    pid 1, so orphans of the solution come back to us)."""
    for _ in range(1000):
        kids = []
        try:
            for d in os.listdir("/proc"):
                if d.isdigit():
                    try:
                        with open("/proc/%s/stat" % d, "rb") as f:
                            if int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                                kids.append(int(d))
                    except (OSError, ValueError, IndexError):
                        pass
        except OSError:
            pass
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reaped = False
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
            reaped = True
        if not kids and not reaped:
            time.sleep(0.005)


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cfg = json.loads(sys.stdin.buffer.read().decode())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    chan = socket.socket(fileno=cfg["chan"])
    mode, uids = cfg["mode"], cfg["uids"]
    try:
        prctl(PR_SET_DUMPABLE, 0)
        if mode == "process":
            prctl(PR_SET_CHILD_SUBREAPER, 1)
            work = cfg["workdir"]
        else:
            work = build_root(cfg)
    except BaseException as e:  # noqa: B036
        os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
        os._exit(15)
    code = cfg.pop("code")
    deadline = _T0 + cfg["timeout_s"]
    sol_sock, judge_sock = socket.socketpair()
    verdict_r, verdict_w = os.pipe()
    sol_pid = os.fork()
    if sol_pid == 0:
        try:
            close_fds_except({sol_sock.fileno()})
            del cfg["chan"]
            drop_privileges(uids[0] if uids else None)
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the credential change clears it
        except BaseException as e:  # noqa: B036
            os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
            os._exit(15)
        solution_main(cfg, code, work, sol_sock)
        os._exit(0)
    del code
    sol_sock.close()
    tests = _read_tests(chan) if cfg["has_tests"] else ""
    judge_pid = os.fork()
    if judge_pid == 0:
        try:
            os.close(verdict_r)
            close_fds_except({judge_sock.fileno(), verdict_w})
            os.chdir("/")
            drop_privileges(uids[1] if uids else None)
            prctl(PR_SET_DUMPABLE, 0)  # after the credential change, which resets it
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            apply_limits(cfg)
            if tests is None:
                raise ValueError("no tests received")
        except BaseException as e:  # noqa: B036
            os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
            os._exit(15)
        judge_main(cfg, tests, judge_sock, verdict_w)
        os._exit(0)
    judge_sock.close()
    os.close(verdict_w)
    me = os.getpid()
    sol_status, judge_status, timed_out = _await_processes(sol_pid, judge_pid, deadline)
    raw = b""
    if not timed_out:
        while True:
            chunk = os.read(verdict_r, 65536)
            if not chunk:
                break
            raw += chunk
    if mode == "process":
        _kill_all_children(me)
    # (namespace modes: we are pid 1; when we exit the kernel kills the whole namespace)
    result = _boot_summary(raw, sol_status, judge_status, timed_out)
    try:
        chan.sendall(json.dumps(result).encode())
        chan.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    os._exit(0)


def _await_processes(sol_pid, judge_pid, deadline):
    """Reap children until the judge is gone or ``deadline`` passes:
    ``(solution status or None, judge status or None, timed out)``."""
    sol_status = judge_status = None
    timed_out = False
    while judge_status is None:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == sol_pid:
            sol_status = status
        elif pid == judge_pid:
            judge_status = status
        elif pid == 0:
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.002)
    return sol_status, judge_status, timed_out


def _boot_summary(raw, sol_status, judge_status, timed_out):
    """The JSON summary boot sends to the host (see the module docstring) from the judge's
    raw verdict and the two wait statuses."""
    try:
        result = json.loads(raw.decode()) if raw else {"verdict": None, "detail": ""}
    except ValueError:
        result = {"verdict": None, "detail": "malformed verdict"}
    solution: dict[str, bool | int]
    if sol_status is None:
        solution = {"killed": True}
    elif os.WIFSIGNALED(sol_status):
        solution = {"signal": os.WTERMSIG(sol_status)}
    else:
        solution = {"exit": os.WEXITSTATUS(sol_status)}
    result.update(
        solution=solution,
        timeout=timed_out,
        judge=None
        if judge_status is None
        else (
            os.WEXITSTATUS(judge_status)
            if os.WIFEXITED(judge_status)
            else -os.WTERMSIG(judge_status)
        ),
    )
    return result
