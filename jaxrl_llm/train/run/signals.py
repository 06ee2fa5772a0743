"""Stopping a run cleanly on Ctrl-C (SIGINT) and SIGTERM.

:func:`stop_signals` installs handlers for the length of a run (main thread only; elsewhere
it does nothing). On the first signal the handler records it, answers every user-code call in
flight (:func:`jaxrl_llm.rewards.user_code.cancel_all`: a background rollout thread waiting on
a hung reward or environment goes on at once) and raises :class:`Interrupted` (SIGINT, a
``KeyboardInterrupt``) or :class:`Terminated` (SIGTERM, its subclass) in the main thread. The
run loop (:class:`jaxrl_llm.train.run.loop.RunLoop`) then saves what it can
(:meth:`~jaxrl_llm.train.run.loop.RunLoop.save_on_stop`) and raises :class:`RunStopped`; the CLI
prints where the run stopped and the command that resumes it, and exits 130 (SIGINT) or 143
(SIGTERM), the shell's 128 + signal number.

Python runs a signal's handler only when the main thread executes Python code: a step held in
one long device computation (the host blocked waiting on it) would hold the stop back for as
long as the computation runs. A watchdog thread wakes on the signal itself
(``signal.set_wakeup_fd``); when the handler has not run within :data:`STOP_GRACE_S` seconds
(``JAXRL_LLM_STOP_GRACE_S`` overrides it), it prints one line and exits with 128 + the signal
number without saving: the newest checkpoint is what a resume continues from.

In a multi-process job a stop waits for the next step boundary instead
(:func:`synced_stops`): there every process learns whether any process of the job received a
signal (one all-reduced flag a step), and all of them save the same step and exit together,
so that no process is left waiting in a collective for one that stopped (the way MaxText and
orbax sync a preemption: ``jax.experimental.multihost_utils.reached_preemption_sync_point``).
This holds from the start of the run's start-up (model load, compile, resume): a stop then is
agreed at the boundary before the first step, where every process ends with exit 143 and
nothing to save.

JAX's own preemption notice is a second trigger at the same boundary
(:func:`jaxrl_llm.parallel.distributed.preemption_notice`, asked at every boundary beside
the gathered flag). In jax 0.10.2 the notice comes from a SIGTERM caught by the C handler
that ``jax.distributed.initialize`` installs (XLA's ``SigtermNotifier``; measured on CPU/gloo:
the signalled process goes on, and both reach the sync point at the same step).
:func:`stop_signals` replaces that handler for the length of a run (Python's
``signal.signal`` installs its own C handler), so during a run a SIGTERM comes here; the
notice covers a SIGTERM between joining the job and the run's start, which JAX's handler
takes and which, unasked, nothing would answer.

A ``KeyboardInterrupt`` raised by user code is not one of these: user code runs on the threads
of :mod:`jaxrl_llm.rewards.user_code`, where it is that call's failure, and Python delivers
signals to the main thread only (https://docs.python.org/3/library/signal.html).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from jaxrl_llm.rewards.user_code import cancel_all, resume_calls


class Interrupted(KeyboardInterrupt):
    """The process received SIGINT (Ctrl-C) during a run."""

    signum = signal.SIGINT


class Terminated(Interrupted):
    """The process received SIGTERM during a run."""

    signum = signal.SIGTERM


class RunStopped(Exception):
    """A run stopped on a signal after saving what it could.

    Attributes:
      signum: the signal (SIGINT or SIGTERM). message: what happened, in one line (the
        checkpoint saved or why none was).
    """

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum, self.message = int(signum), message

    @property
    def exit_status(self) -> int:
        """128 + the signal number: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


_DEFER = {"depth": 0, "pending": 0}

#: Open :func:`held` blocks (an update in flight).
_HOLD = {"depth": 0}

#: Whether a stop waits for the step boundary that every process of a job agrees on
#: (:func:`synced_stops`).
_SYNC = {"on": False}


def _raise(signum: int):
    raise Terminated() if signum == signal.SIGTERM else Interrupted()


#: Seconds a stop signal may wait for the main thread to reach Python code (the next host
#: boundary of a step) before the run exits without saving (module docstring).
STOP_GRACE_S = 60.0


class _Watchdog:
    """Exits the process when a stop signal's handler has not run within ``grace`` seconds of
    the signal (see the module docstring); one per outermost :func:`stop_signals`."""

    def __init__(self, grace: float):
        self.grace = grace
        self.handled = threading.Event()
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._previous = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="jaxrl-llm-stop", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._r, 1)
            except OSError:
                return
            if not data:
                return  # closed
            if data[0] not in (signal.SIGINT, signal.SIGTERM) or self.handled.wait(self.grace):
                continue
            name = signal.Signals(data[0]).name
            os.write(
                2,
                f"jaxrl-llm train: stopped by {name}: the step did not reach a host boundary "
                f"within {self.grace:g} s (a device computation was running); exited without "
                f"saving: resume from the newest checkpoint\n".encode(),
            )
            os._exit(128 + data[0])

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        os.close(self._w)  # the thread reads end-of-file and returns
        self._thread.join(timeout=5)
        os.close(self._r)


_WATCH: dict[str, _Watchdog | None] = {"dog": None}


def _grace() -> float:
    try:
        return float(os.environ.get("JAXRL_LLM_STOP_GRACE_S", STOP_GRACE_S))
    except ValueError:
        return STOP_GRACE_S


def _handler(signum, frame):
    dog = _WATCH["dog"]
    if dog is not None:
        dog.handled.set()
    if _SYNC["on"]:  # held for the boundary every process agrees on; the step runs on whole
        _DEFER["pending"] = max(_DEFER["pending"], signum)
        return
    cancel_all("interrupted")
    if _DEFER["depth"] or _HOLD["depth"]:
        _DEFER["pending"] = signum
        return
    _raise(signum)


@contextlib.contextmanager
def deferred():
    """Hold a signal that arrives inside the block until its end (a few statements that must
    run together, such as logging a step and recording that it is finished; a signal landing
    between them would leave a stop unable to say which step it may save)."""
    _DEFER["depth"] += 1
    try:
        yield
    finally:
        _DEFER["depth"] -= 1
        if not _SYNC["on"]:  # synced: the step boundary answers it (synced_stops)
            signum, _DEFER["pending"] = _DEFER["pending"], 0
            if signum and not _DEFER["depth"]:
                _raise(signum)


@contextlib.contextmanager
def held():
    """A block that runs whole, then the step goes on to its end: a stop signal inside it is
    recorded, not raised, and stays pending past the block until the run loop has logged the
    step (its :func:`deferred` block in :meth:`~jaxrl_llm.train.run.loop.RunLoop._step`);
    the stop then saves that step. For a step's updates: a stop inside them would leave the
    train state between two steps (the previous one donated to the update, the new one not
    yet a finished step), with nothing a checkpoint could hold. A signal before the block
    (the rollout) is raised at once, as ever; the block's own work has no user code to wait
    on, so the wait is that of the update (:data:`STOP_GRACE_S` still bounds a computation
    that outlasts it)."""
    _HOLD["depth"] += 1
    try:
        yield
    finally:
        _HOLD["depth"] -= 1


def stop_held() -> int:
    """A stop signal recorded by a :func:`held` block and not yet answered, one process
    (0 when none; a multi-process job's stops are :func:`pending_stop`'s)."""
    return 0 if _SYNC["on"] else int(_DEFER["pending"])


@contextlib.contextmanager
def synced_stops(on: bool = True):
    """For the block, a stop signal is only recorded: the run loop asks at each step boundary
    whether any process of the job has one (:func:`pending_stop`, all-reduced by the loop) and
    then every process stops at that same step. No user call is cancelled (that would change
    the step on one process only). Used for multi-process runs."""
    before = _SYNC["on"]
    _SYNC["on"] = on
    try:
        yield
    finally:
        _SYNC["on"] = before


def pending_stop() -> int:
    """The stop signal recorded under :func:`synced_stops` (0 when none)."""
    return int(_DEFER["pending"]) if _SYNC["on"] else 0


@contextlib.contextmanager
def stop_signals():
    """SIGINT / SIGTERM raise :class:`Interrupted` / :class:`Terminated` in the main thread
    for the length of the block (see the module docstring); the previous handlers come back
    after it. User calls run again from its start
    (:func:`~jaxrl_llm.rewards.user_code.resume_calls`); after a signal they stay refused past
    its end, so that the clean-up after it (a rollout thread finishing its job) is quick.
    A block inside another (the run loop's inside the trainer's start-up) keeps what the
    outer one recorded: a signal held during start-up (:func:`synced_stops`) is still
    pending at the first step boundary."""
    if threading.current_thread() is not threading.main_thread():
        resume_calls()
        _DEFER.update(depth=0, pending=0)
        yield
        return
    outermost = _WATCH["dog"] is None
    if outermost:
        resume_calls()
        _DEFER.update(depth=0, pending=0)
        _HOLD.update(depth=0)
    old = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    if outermost:
        _WATCH["dog"] = _Watchdog(_grace())
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        dog = _WATCH["dog"]
        if outermost and dog is not None:
            _WATCH["dog"] = None
            dog.close()
