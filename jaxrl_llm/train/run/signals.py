"""Stopping a run cleanly on Ctrl-C (SIGINT) and SIGTERM.

:func:`stop_signals` installs handlers for the length of a run (main thread only; elsewhere
it does nothing). On the first signal the handler records it, answers every user-code call in
flight (:func:`jaxrl_llm.rewards.user_code.cancel_all`: a background rollout thread waiting on
a hung reward or environment goes on at once) and raises :class:`Interrupted` (SIGINT, a
``KeyboardInterrupt``) or :class:`Terminated` (SIGTERM, its subclass) in the main thread. The
run loop (:class:`jaxrl_llm.train.run.loop.Trainer`) then saves what it can
(:meth:`~jaxrl_llm.train.run.loop.Trainer.save_on_stop`) and raises :class:`RunStopped`; the CLI
prints where the run stopped and the command that resumes it, and exits 130 (SIGINT) or 143
(SIGTERM), the shell's 128 + signal number.

A ``KeyboardInterrupt`` raised by user code is not one of these: user code runs on the threads
of :mod:`jaxrl_llm.rewards.user_code`, where it is that call's failure, and Python delivers
signals to the main thread only (https://docs.python.org/3/library/signal.html).
"""

from __future__ import annotations

import contextlib
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


def _raise(signum: int):
    raise Terminated() if signum == signal.SIGTERM else Interrupted()


def _handler(signum, frame):
    cancel_all("interrupted")
    if _DEFER["depth"]:
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
        signum, _DEFER["pending"] = _DEFER["pending"], 0
        if signum and not _DEFER["depth"]:
            _raise(signum)


@contextlib.contextmanager
def stop_signals():
    """SIGINT / SIGTERM raise :class:`Interrupted` / :class:`Terminated` in the main thread
    for the length of the block (see the module docstring); the previous handlers come back
    after it. User calls run again from its start
    (:func:`~jaxrl_llm.rewards.user_code.resume_calls`); after a signal they stay refused past
    its end, so that the clean-up after it (a rollout thread finishing its job) is quick."""
    resume_calls()
    _DEFER.update(depth=0, pending=0)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
