"""Environments for the tests: scripted replies, sleeps, failures, and broken contracts."""

from __future__ import annotations

import threading
import time

from jaxrl_llm.envs import Step

# Char-tokenizer ids of letters and digits: as stop tokens they end the random tiny model's
# turns after a few tokens, so its episodes take several turns.
STOP = tuple(3 + b for b in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


class Scripted:
    """Replies ``replies[t]`` (a user message) to turn t with reward ``0.25 * (t + 1)``; done
    after ``len(replies) + 1`` turns (the last turn is answered with done and reward 1)."""

    lock = threading.Lock()
    in_flight = 0
    max_in_flight = 0
    calls: list[tuple[str, float, float]] = []  # (tag, start, end) of every step call

    def __init__(self, replies=("ok", "more"), sleep: float = 0.0, tag: str = "", fail_on=None):
        self.replies, self.sleep, self.tag, self.fail_on = list(replies), sleep, tag, fail_on
        self.t = 0

    def reset(self, item):
        return (
            [{"role": "user", "content": item["prompt"]}]
            if isinstance(item["prompt"], str)
            else list(item["prompt"])
        )

    def step(self, text):
        cls = Scripted
        start = time.perf_counter()
        with cls.lock:
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
        try:
            if self.sleep:
                time.sleep(self.sleep)
            if self.fail_on is not None and self.t == self.fail_on:
                raise RuntimeError("scripted failure")
            t, self.t = self.t, self.t + 1
            if t >= len(self.replies):
                return Step(reward=1.0, done=True)
            return Step(
                messages=[{"role": "user", "content": self.replies[t]}],
                reward=0.25 * (t + 1),
                info={"replies": 1},
            )
        finally:
            with cls.lock:
                cls.in_flight -= 1
                cls.calls.append((self.tag, start, time.perf_counter()))


class AlwaysFails:
    def reset(self, item):
        return [{"role": "user", "content": "x"}]

    def step(self, text):
        raise RuntimeError("this environment always fails")


class ReturnsDict:
    def reset(self, item):
        return [{"role": "user", "content": "x"}]

    def step(self, text):
        return {"reward": 1.0}


class NoStep:
    def reset(self, item):
        return []


class StepWithoutText:
    def reset(self, item):
        return []

    def step(self):
        return Step()


def not_a_class(item):
    return []
