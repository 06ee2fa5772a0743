"""Process (per-step) rewards."""

import numpy as np
import pytest

from jaxrl_llm.errors import RewardError
from jaxrl_llm.rewards import (
    math_answer_reward,
    outcome_as_process,
    pad_step_rewards,
    process_rewards,
    split_steps,
)


def test_split_steps_spans():
    text = "a = 1\n\nb = 2\n  \nc = 3"
    steps = split_steps(text)
    assert [s for s, _, _ in steps] == ["a = 1", "b = 2", "c = 3"]
    for s, start, end in steps:
        assert text[start:end] == s
    assert split_steps("") == []
    assert [s for s, _, _ in split_steps("x. y. z", delimiter=r"\.\s*")] == ["x", "y", "z"]


def test_process_rewards_and_failures():
    def scorer(prompt, steps, *, answer):
        if "boom" in prompt:
            raise ValueError("bad")
        if "short" in prompt:
            return [1.0]  # wrong count
        return [float(str(answer) in s) for s in steps]

    out = process_rewards(
        scorer, ["p", "boom", "short"], ["x\n4\n7", "4", "1\n2"], answer=[4, 4, 4]
    )
    assert out == [[0.0, 1.0, 0.0], None, None]
    with pytest.raises(RewardError):
        process_rewards(scorer, ["p"], ["a", "b"])


def test_pad_step_rewards():
    r, m = pad_step_rewards([[1.0, 2.0], None, [3.0]])
    np.testing.assert_array_equal(r, [[1, 2], [0, 0], [3, 0]])
    np.testing.assert_array_equal(m, [[1, 1], [0, 0], [1, 0]])
    r, m = pad_step_rewards([[1.0, 2.0, 3.0]], max_steps=2)
    assert r.shape == (1, 2) and m.all()


def test_outcome_as_process_scores_prefixes():
    scorer = outcome_as_process(math_answer_reward)
    out = process_rewards(scorer, ["q"], ["3 + 4 = 7\nso 7 + 1 = 8"], answer=["8"])
    assert out == [[0.0, 1.0]]
