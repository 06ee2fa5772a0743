import threading
import time

import pytest

from jaxrl_llm.errors import RewardError
from jaxrl_llm.rewards import RewardSet
from jaxrl_llm.rewards.math_verify import math_verify_reward


def _score(completions, answers, **kw):
    return math_verify_reward(["q"] * len(completions), completions, answer=answers, **kw)


def test_equivalent_forms_of_one_half():
    replies = [
        "The answer is $\\frac{1}{2}$.",
        "so x = 0.5",
        "\\boxed{\\frac12}",
        "Final: \\boxed{0.5}",
        "It is 1/2",
        "\\boxed{\\dfrac{1}{2}}",
    ]
    for ref in ("0.5", "1/2", "\\frac{1}{2}", "$\\frac{1}{2}$", "\\boxed{1/2}"):
        assert _score(replies, [ref] * len(replies)) == [1.0] * len(replies), ref


def test_wrong_answers_and_the_boxed_answer_wins():
    replies = [
        "The answer is 41.",
        "I first thought 3, but \\boxed{4}",
        "no answer here",
        "\\boxed{0.51}",
    ]
    assert _score(replies, ["42", "3", "7", "0.5"]) == [0.0, 0.0, 0.0, 0.0]
    assert _score(["I first thought 3, but \\boxed{4}"], ["4"]) == [1.0]


def test_symbolic_and_latex_references():
    replies = [
        "$\\frac{\\sqrt{2}}{2}$",
        "\\boxed{(x+1)^2}",
        "\\boxed{\\pi}",
        "#### 72",
        "\\boxed{1234}",
    ]
    refs = ["\\sqrt{2}/2", "x^2+2x+1", "\\pi", "The sum is 72.\n#### 72", "1,234"]
    assert _score(replies, refs) == [1.0] * 5
    assert _score(["\\boxed{2\\pi}"], ["\\pi"]) == [0.0]
    assert _score(["\\boxed{\\{1,2\\}}"], ["\\{2, 1\\}"]) == [1.0]  # sets


def test_missing_or_unparsable_reference_gives_no_score():
    assert _score(["\\boxed{1}", "\\boxed{1}"], [None, "1"]) == [None, 1.0]
    assert _score(["\\boxed{1}"] * 2, ["", "\\boxed{}"]) == [None, None]
    out = RewardSet([math_verify_reward])(
        ["q", "q"], ["\\boxed{2}", "\\boxed{3}"], answer=["2", None]
    )
    assert out.valid.tolist() == [True, False]
    assert out.rewards.tolist() == [1.0, 0.0]
    assert out.metrics["rewards/math_verify_reward/accuracy"] == 1.0


def test_timeout_scores_zero_in_and_off_the_main_thread(monkeypatch):
    import math_verify

    real_parse = math_verify.parse

    def slow_parse(text, **kw):
        if "SLOW" in text:
            time.sleep(30)
        return real_parse(text, **kw)

    monkeypatch.setattr(math_verify, "parse", slow_parse)
    start = time.monotonic()
    assert _score(["SLOW \\boxed{1}", "\\boxed{1}"], ["1", "1"], timeout_seconds=0.3) == [0.0, 1.0]
    assert time.monotonic() - start < 10
    got = []
    worker = threading.Thread(
        target=lambda: got.append(
            _score(["SLOW \\boxed{1}", "\\boxed{1}"], ["1", "1"], timeout_seconds=0.3)
        )
    )
    worker.start()
    worker.join(20)
    assert got == [[0.0, 1.0]]
    with pytest.raises(RewardError, match="timeout_seconds"):
        _score(["1"], ["1"], timeout_seconds=0)


def test_an_enclosing_timer_keeps_its_remaining_time():
    import signal

    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 5.0)
        assert _score(["\\boxed{3}"], ["3"]) == [1.0]
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 5.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not fired
