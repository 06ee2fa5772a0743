"""Environments for the tests: scripted replies, sleeps, failures, and broken contracts; and
the chat-message prompts they run on (:func:`write_chat_rows`)."""

from __future__ import annotations

import itertools
import json
import random
import threading
import time

from jaxrl_llm.envs import Step


def write_chat_rows(d, train: int, eval: int) -> None:
    """``train.jsonl`` / ``eval.jsonl`` in ``d``: chat-message prompts
    ``[{"role": "user", "content": "ab>"}]`` with ``answer`` the larger digit, the first
    ``train`` rows and the ``eval`` after them (seeded: the same rows every time)."""
    rng = random.Random(0)
    rows = []
    for _ in range(train + eval):
        a, b = rng.sample(range(10), 2)
        rows.append({"prompt": [{"role": "user", "content": f"{a}{b}>"}], "answer": str(max(a, b))})
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:train]))
    (d / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[train:]))


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


class Misbehaves(Scripted):
    """:class:`Scripted`, except that a data row's ``mode`` column makes its episodes misbehave
    on their first step: ``exit`` calls ``sys.exit(0)``, ``exit3`` raises ``SystemExit(3)``,
    ``interrupt`` raises ``KeyboardInterrupt``, ``raise`` a ``RuntimeError``, ``hang`` sleeps
    ``hang_s`` seconds (past the run's ``env.step_timeout_s``), ``huge`` returns a reward of
    1e308 twice (the total overflows), ``text_info`` a string in ``Step.info``."""

    def __init__(self, hang_s: float = 30.0, **kw):
        super().__init__(**kw)
        self.hang_s, self.mode = hang_s, "ok"

    def reset(self, item):
        self.mode = item.get("mode") or "ok"
        return super().reset(item)

    def step(self, text):
        import sys

        mode = self.mode
        if mode == "exit":
            sys.exit(0)
        if mode == "exit3":
            raise SystemExit(3)
        if mode == "interrupt":
            raise KeyboardInterrupt
        if mode == "raise":
            raise RuntimeError("misbehaving environment")
        if mode == "hang":
            time.sleep(self.hang_s)
        if mode == "huge":
            return Step(messages=[{"role": "user", "content": "ok"}], reward=1e308)
        if mode == "text_info":
            return Step(reward=0.5, done=True, info={"note": "a string", "n": 2})
        return super().step(text)


def misbehaving_reward(prompts, completions, *, reward_mode=None, hang_s=30.0, **_):
    """A reward whose rows misbehave by their data's ``reward_mode`` column: ``exit`` calls
    ``sys.exit(0)``, ``hang`` sleeps ``hang_s`` seconds, ``raise`` raises; the others score
    0.5 (1.0 for a completion that starts with a digit)."""
    import sys

    modes = reward_mode or [None] * len(completions)
    if "exit" in modes:
        sys.exit(0)
    if "raise" in modes:
        raise ValueError("misbehaving reward")
    if "hang" in modes:
        time.sleep(hang_s)
    return [1.0 if c.strip()[:1].isdigit() else 0.5 for c in completions]


class LongOpening(Scripted):
    """Opens with a 200-character user message: past a run's ``data.max_length`` of 32."""

    def reset(self, item):
        return [{"role": "user", "content": "x" * 200}]


class HalfLongOpening(Scripted):
    """Every other episode (by the order of their ``reset`` calls) opens as :class:`LongOpening`."""

    calls = itertools.count()

    def reset(self, item):
        if next(HalfLongOpening.calls) % 2:
            return [{"role": "user", "content": "x" * 200}]
        return super().reset(item)
