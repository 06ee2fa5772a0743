"""User code on the runner's threads: what it raises (``BaseException`` included) is the call's
failure, a call past its deadline is answered with a timeout (and a pure-Python loop is ended),
a stopping run answers every call at once."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from jaxrl_llm.rewards.user_code import (
    UserCodeRunner,
    cancel_all,
    check_timeout,
    resume_calls,
)


@pytest.fixture
def runner():
    resume_calls()
    yield UserCodeRunner(2, "test")
    resume_calls()


def _raise(e):
    raise e


@pytest.mark.parametrize(
    "exc,error",
    [
        (SystemExit(0), "SystemExit: 0"),
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (ValueError("bad"), "ValueError: bad"),
    ],
)
def test_anything_raised_is_the_calls_failure(runner, exc, error):
    res = runner.call(_raise, exc)
    assert not res.ok and res.error == error and res.exception is exc and not res.timed_out


def test_sys_exit_is_contained(runner):
    res = runner.call(sys.exit, 0)
    assert res.error == "SystemExit: 0"
    assert runner.call(lambda: 7).value == 7  # the pool goes on


def test_a_call_past_its_deadline_times_out_and_a_python_loop_is_ended(runner):
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    t = time.perf_counter()
    res = runner.call(spin, timeout_s=0.2)
    assert res.timed_out and res.error == "timeout: no answer after 0.2 s"
    assert time.perf_counter() - t < 2.0
    deadline = time.time() + 5  # the loop got UserCodeTimeout: its thread ends
    while runner.stuck and time.time() < deadline:
        time.sleep(0.02)
    assert runner.stuck == 0
    stop.set()


def test_a_thread_blocked_in_c_is_replaced_and_counted(runner):
    res = runner.call(time.sleep, 1.0, timeout_s=0.1)
    assert res.timed_out
    assert runner.stuck == 1
    assert [runner.call(lambda i=i: i).value for i in range(3)] == [0, 1, 2]  # capacity kept
    time.sleep(1.2)
    assert runner.stuck == 0  # the sleep ended; its thread retired


def test_cancel_all_answers_calls_in_flight_and_refuses_new_ones(runner):
    fut = runner.submit(time.sleep, 30)
    time.sleep(0.05)
    cancel_all()
    assert fut.result(timeout=1).error == "interrupted"
    assert runner.call(lambda: 1).error == "interrupted"
    resume_calls()
    assert runner.call(lambda: 1).value == 1


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "3"])
def test_timeouts_are_positive_finite_seconds(bad):
    with pytest.raises(ValueError, match="timeout_s"):
        check_timeout(bad, "timeout_s")
    check_timeout(None, "timeout_s")
