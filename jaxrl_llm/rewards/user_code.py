"""Running user code (reward functions, environment ``reset`` / ``step``, tools) so that it can
neither end, hang nor crash the run.

Every call goes to :class:`UserCodeRunner`, a pool of daemon threads, and comes back as a
:class:`CallResult`: its value, or the error it raised, or a timeout. Nothing the code does
reaches the caller as an exception:

* ``BaseException`` is caught: ``sys.exit(0)``, ``raise SystemExit(3)``, a ``KeyboardInterrupt``
  raised by the code itself. Python delivers a real SIGINT only to the main thread, and user code
  never runs there, so a ``KeyboardInterrupt`` caught in a worker is always the code's own
  (https://docs.python.org/3/library/signal.html#signals-and-threads).
* A call that has not returned by its deadline is answered with a timeout by a watchdog
  thread; the caller goes on at once. A thread cannot be killed from outside: the watchdog asks
  the stuck thread to raise :class:`UserCodeTimeout` (``PyThreadState_SetAsyncExc``, which
  ends code that is running Python bytecode, e.g. a ``while True`` loop, at its next
  instruction) and starts a replacement worker, so the pool keeps its capacity. A thread blocked
  in C (``time.sleep(1e9)``, a socket read without timeout) stays blocked until that call
  returns; it is a daemon thread, so it never keeps the process from exiting, and
  :attr:`UserCodeRunner.stuck` counts such threads. What a thread cannot contain is code that
  ends the process itself (``os._exit``, ``os.kill(os.getpid(), SIGKILL)``): that needs a
  process boundary, which the code sandbox (:mod:`jaxrl_llm.rewards.sandbox`) gives programs.
* :func:`cancel_all` answers every call in flight at once (a real Ctrl-C or SIGTERM), so a
  background rollout thread waiting on a hung reward ends within seconds.

Why threads and not a persistent process pool: environments are stateful objects that live
across the turns of an episode (and tests and users read their class attributes), and reward
functions may hold device arrays (a reward model); moving them into worker processes would
change what user code may be, and every argument and result would be pickled. The cost per call
is not the reason: ``tools/bench/soak_envs.py --overhead 2000`` measured about 27 us per
trivial call on a thread against about 81 us for a round trip to a forkserver worker process
(a shared, loaded 2-core machine; indicative only). What a process would add is containing
``os._exit`` and a stuck C call that ignores everything (the worker killed and replaced); a
thread cannot. verl bounds reward scoring the same way, with ``asyncio.wait_for`` around the
call (its reward loop: 600 s; its PRIME reward manager, which scores in a
``ProcessPoolExecutor``: 300 s, the default here).
"""

from __future__ import annotations

import ctypes
import dataclasses
import heapq
import itertools
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from jaxrl_llm.errors import RewardError

log = logging.getLogger("jaxrl_llm")


class UserCodeStop(RewardError):
    """User code failed and its config says ``on_error: raise``: the run stops (after saving
    what a Ctrl-C saves) with this one line."""


class UserCodeTimeout(BaseException):
    """Raised inside a user-code thread whose call passed its deadline (see the module
    docstring); a ``BaseException`` so that ``except Exception`` in user code does not swallow
    it."""


@dataclasses.dataclass(frozen=True, slots=True)
class CallResult:
    """The outcome of one user-code call.

    Attributes:
      value: what the call returned (None when it failed).
      error: None on success, else ``"<ExceptionType>: <message>"`` (for ``sys.exit(3)``:
        ``"SystemExit: 3"``) or ``"timeout: no answer after <s> s"``.
      seconds: wall time until the answer (the deadline for a timeout).
      timed_out: the call passed its deadline.
      exception: the exception the call raised (None otherwise), for callers that re-raise
        their own error types.
    """

    value: Any = None
    error: str | None = None
    seconds: float = 0.0
    timed_out: bool = False
    exception: BaseException | None = None

    @property
    def ok(self) -> bool:
        """The call returned."""
        return self.error is None


def describe(e: BaseException) -> str:
    """``"<ExceptionType>: <message>"``, cut to 300 characters (a hostile message can be
    megabytes long)."""
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


@dataclasses.dataclass(eq=False)
class _Item:
    fn: Callable
    args: tuple
    future: Future
    timeout_s: float | None
    start: float = 0.0
    thread: int | None = None  # the worker's thread id while it runs the call


class UserCodeRunner:
    """A pool of daemon threads that runs user calls with deadlines (see the module docstring).

    Args:
      max_workers: threads that run calls at once (more calls wait in a queue; the deadline
        starts when a call starts running).
      name: thread-name prefix.
    """

    def __init__(self, max_workers: int = 8, name: str = "user"):
        self.max_workers, self.name = max(int(max_workers), 1), name
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._idle = self._workers = 0
        self._stuck: set[int] = set()
        self._running: set[_Item] = set()
        self._deadlines: list[tuple[float, int, _Item]] = []
        self._counter = itertools.count()
        self._watchdog: threading.Thread | None = None
        self.timeouts = 0
        _RUNNERS.add(self)

    @property
    def stuck(self) -> int:
        """Threads still running a call that timed out (blocked in C; see the module docstring)."""
        with self._lock:
            return len(self._stuck)

    @property
    def threads(self) -> int:
        """Worker threads alive (stuck ones included)."""
        with self._lock:
            return self._workers

    def submit(self, fn: Callable, *args: Any, timeout_s: float | None = None) -> Future:
        """Run ``fn(*args)``; the future's result is a :class:`CallResult` (it never raises).
        While the run is stopping (:func:`cancel_all`), calls are answered ``interrupted``
        without running."""
        item = _Item(fn, args, Future(), timeout_s if timeout_s and timeout_s > 0 else None)
        if STOPPING.is_set():
            _resolve(item.future, CallResult(error="interrupted"))
            return item.future
        self._queue.put(item)
        with self._lock:
            if self._idle == 0:
                self._grow()
        return item.future

    def call(self, fn: Callable, *args: Any, timeout_s: float | None = None) -> CallResult:
        """``submit(...)`` and wait for its :class:`CallResult`."""
        return self.submit(fn, *args, timeout_s=timeout_s).result()

    def cancel(self, reason: str = "interrupted") -> None:
        """Answer every call running or queued with ``error=reason`` (Ctrl-C / SIGTERM)."""
        with self._lock:
            items = list(self._running)
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for it in items:
            _resolve(it.future, CallResult(error=reason))

    def _grow(self) -> None:  # under the lock: one more worker, within the pool's size
        if self._workers - len(self._stuck) < self.max_workers:
            self._workers += 1
            threading.Thread(
                target=self._work, name=f"{self.name}-{self._workers}", daemon=True
            ).start()

    def _work(self) -> None:
        tid = threading.get_ident()
        try:
            while True:
                with self._lock:
                    self._idle += 1
                item = self._queue.get()
                with self._lock:
                    self._idle -= 1
                if item.future.done():  # cancelled while queued
                    continue
                if self._run(item, tid):
                    return  # given up on by the watchdog, which started a replacement
        except BaseException:  # noqa: BLE001 - a late UserCodeTimeout landing in our own code
            pass
        finally:
            with self._lock:
                self._workers -= 1
                self._stuck.discard(tid)

    def _run(self, item: _Item, tid: int) -> bool:
        """Run one call; True when the watchdog gave up on it (this thread then retires)."""
        with self._lock:
            item.start, item.thread = time.perf_counter(), tid
            self._running.add(item)
            if item.timeout_s is not None:
                due = item.start + item.timeout_s
                heapq.heappush(self._deadlines, (due, next(self._counter), item))
                if self._watchdog is None:
                    self._watchdog = threading.Thread(
                        target=self._watch, name=f"{self.name}-watchdog", daemon=True
                    )
                    self._watchdog.start()
                self._wake.notify()
        try:
            value = item.fn(*item.args)
        except BaseException as e:  # noqa: BLE001 - sys.exit and friends included: see module
            result = CallResult(error=describe(e), exception=e)
        else:
            result = CallResult(value=value)
        result = dataclasses.replace(result, seconds=time.perf_counter() - item.start)
        with self._lock:
            abandoned = tid in self._stuck
            item.thread = None
            self._running.discard(item)
        if not abandoned:
            _resolve(item.future, result)
        return abandoned

    def _watch(self) -> None:
        with self._lock:
            while True:
                while self._deadlines and self._deadlines[0][2].thread is None:
                    heapq.heappop(self._deadlines)  # finished in time
                if not self._deadlines:
                    self._wake.wait()
                    continue
                due, _, item = self._deadlines[0]
                wait = due - time.perf_counter()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                heapq.heappop(self._deadlines)
                tid = item.thread
                if tid is None:
                    continue
                self.timeouts += 1
                self._stuck.add(tid)
                self._running.discard(item)
                _interrupt(tid)
                self._grow()  # the pool keeps its capacity while the stuck thread lingers
                _resolve(
                    item.future,
                    CallResult(
                        error=f"timeout: no answer after {item.timeout_s:g} s",
                        seconds=float(item.timeout_s or 0.0),
                        timed_out=True,
                    ),
                )


def _resolve(future: Future, result: CallResult) -> None:
    try:
        future.set_result(result)
    except InvalidStateError:  # answered already (a timeout or a cancel won the race)
        pass


def _interrupt(thread_id: int) -> None:
    """Ask a thread to raise :class:`UserCodeTimeout` at its next Python instruction."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(UserCodeTimeout)
    )


_RUNNERS: weakref.WeakSet[UserCodeRunner] = weakref.WeakSet()


#: Set while a run stops (:func:`cancel_all`): new calls are answered at once, unrun.
STOPPING = threading.Event()


def cancel_all(reason: str = "interrupted") -> None:
    """Answer every user call in flight in this process with ``error=reason``, and every call
    made after it until :func:`resume_calls` (a real Ctrl-C or SIGTERM): callers waiting on
    user code, a background rollout thread included, go on at once."""
    STOPPING.set()
    for runner in list(_RUNNERS):
        runner.cancel(reason)


def resume_calls() -> None:
    """Run user calls again after :func:`cancel_all` (a new run in the same process)."""
    STOPPING.clear()


_SHARED: dict[str, UserCodeRunner] = {}
_SHARED_LOCK = threading.Lock()


def shared_runner(name: str, max_workers: int = 8) -> UserCodeRunner:
    """The process's runner called ``name`` (created on first use with ``max_workers``;
    persistent, so its threads are reused across steps)."""
    with _SHARED_LOCK:
        runner = _SHARED.get(name)
        if runner is None or runner.max_workers < max_workers:
            runner = _SHARED[name] = UserCodeRunner(max_workers, name)
        return runner


def check_timeout(value: float | None, key: str) -> None:
    """A :class:`ValueError` naming ``key`` unless ``value`` is None or a finite number > 0."""
    if value is not None and not (isinstance(value, int | float) and math.isfinite(value)):
        raise ValueError(f"{key} must be a finite number of seconds > 0 (or null), got {value!r}")
    if value is not None and value <= 0:
        raise ValueError(f"{key} must be > 0 seconds (or null: no limit), got {value}")
