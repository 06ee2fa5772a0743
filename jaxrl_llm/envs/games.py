"""Two small built-in environments: ``single_turn`` (one answer, scored by the reward functions)
and ``guess_number`` (a multi-turn feedback game)."""

from __future__ import annotations

import re

from jaxrl_llm.envs.base import Step


def _opening(item: dict) -> list[dict]:
    """The row's prompt as chat messages."""
    prompt = item.get("prompt")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in (prompt or ())]


class SingleTurnEnv:
    """One policy turn: the opening is the row's prompt, ``step`` ends the episode with reward
    0, and the configured reward functions score the answer. A run with this environment
    trains as a run without ``env`` (tests/envs/test_single_turn.py)."""

    def reset(self, item: dict) -> list[dict]:
        """The row's prompt as messages."""
        return _opening(item)

    def step(self, text: str) -> Step:
        """The episode ends after the first answer."""
        del text
        return Step(done=True)


class GuessNumberEnv:
    """Guess a secret integer in [low, high]; each guess is answered "higher", "lower" or
    "correct". The secret is the row's ``answer`` column (an int), or ``(low + high) // 2``.

    Reward: ``win_reward`` for the correct guess, minus ``turn_cost`` per guess; a turn
    without a number is answered with a reminder of the rules.

    Args:
      low, high: the range; win_reward: reward of a correct guess; turn_cost: cost per guess.
    """

    def __init__(
        self, low: int = 1, high: int = 100, win_reward: float = 1.0, turn_cost: float = 0.0
    ):
        self.low, self.high = int(low), int(high)
        self.win_reward, self.turn_cost = float(win_reward), float(turn_cost)
        self.secret = (self.low + self.high) // 2

    def reset(self, item: dict) -> list[dict]:
        """The rules (and the row's prompt, if any)."""
        if item.get("answer") is not None:
            self.secret = int(item["answer"])
        rules = (
            f"I am thinking of an integer between {self.low} and {self.high}. Guess it: answer "
            f"with one number. I will say higher, lower or correct."
        )
        chat = _opening(item)
        return chat if chat else [{"role": "user", "content": rules}]

    def step(self, text: str) -> Step:
        """Compare the last integer in ``text`` with the secret."""
        nums = re.findall(r"-?\d+", text)
        if not nums:
            return Step(
                messages=[{"role": "user", "content": "Answer with one number."}],
                reward=-self.turn_cost,
                info={"no_guess": 1},
            )
        guess = int(nums[-1])
        if guess == self.secret:
            return Step(reward=self.win_reward - self.turn_cost, done=True, info={"wins": 1})
        hint = "higher" if guess < self.secret else "lower"
        return Step(messages=[{"role": "user", "content": hint}], reward=-self.turn_cost)
