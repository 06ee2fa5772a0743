"""RewardSet: weights, and containment of raising / NaN / None / wrong-count functions."""

import math

import numpy as np
import pytest

from jaxrl_llm.errors import RewardError
from jaxrl_llm.rewards import RewardSet, RewardSpec, combine_rewards

P = ["p0", "p1", "p2", "p3"]
C = ["0", "1", "2", "3"]


def ident(prompts, completions, **_):
    return [float(c) for c in completions]


def const(prompts, completions, **_):
    return [0.5] * len(completions)


def test_weighted_sum_and_metrics():
    rs = combine_rewards([(ident, 2.0), (const, -1.0)])
    out = rs(P, C)
    np.testing.assert_allclose(out.rewards, [-0.5, 1.5, 3.5, 5.5])
    assert out.rewards.dtype == np.float32 and out.valid.all()
    assert out.metrics["rewards/ident/mean"] == pytest.approx(1.5)
    assert out.metrics["rewards/ident/std"] == pytest.approx(np.std([0, 1, 2, 3]))
    assert out.metrics["rewards/ident/failures"] == 0
    assert "rewards/ident/accuracy" not in out.metrics
    r, valid, metrics = out
    assert metrics["rewards/total/mean"] == pytest.approx(2.5)


def test_accuracy_only_for_binary_scores():
    binary = lambda p, c, **_: [1.0, 0.0, 1.0, 1.0]  # noqa: E731
    out = RewardSet([RewardSpec(binary, 1.0, name="acc")])(P, C)
    assert out.metrics["rewards/acc/accuracy"] == pytest.approx(0.75)


def test_raising_sample_is_isolated():
    def picky(prompts, completions, **_):
        return [1.0 / (int(c) - 2) for c in completions]  # sample "2" divides by zero

    out = RewardSet([picky, const])(P, C)
    np.testing.assert_array_equal(out.valid, [True, True, False, True])
    np.testing.assert_allclose(out.rewards, [-0.5 + 0.5, -1.0 + 0.5, 0.0, 1.0 + 0.5])
    assert out.metrics["rewards/picky/failures"] == 1
    assert math.isnan(out.per_function["picky"][2])


def test_nan_inf_none_and_wrong_types_are_invalid():
    def messy(prompts, completions, **_):
        return [float("nan"), None, "1.0", np.float32(2.0)]

    def infinite(prompts, completions, **_):
        return [1.0, 1.0, 1.0, float("inf")]

    out = RewardSet([messy, infinite])(P, C)
    np.testing.assert_array_equal(out.valid, [False, False, False, False])
    assert out.metrics["rewards/messy/failures"] == 3
    assert out.metrics["rewards/infinite/failures"] == 1
    np.testing.assert_array_equal(out.rewards, 0.0)
    only_messy = RewardSet([messy])(P, C)
    np.testing.assert_array_equal(only_messy.valid, [False, False, False, True])
    assert only_messy.rewards[3] == 2.0


def test_fields_are_passed_aligned():
    def uses_answer(prompts, completions, *, answer, **_):
        return [float(c == a) for c, a in zip(completions, answer)]

    out = RewardSet([uses_answer])(P, C, answer=["0", "x", "2", "y"])
    np.testing.assert_array_equal(out.rewards, [1, 0, 1, 0])
    with pytest.raises(RewardError, match="field 'answer' has 3 values"):
        RewardSet([uses_answer])(P, C, answer=["0", "1", "2"])


def test_wrong_count_tolerated_once_then_raises():
    calls = {"n": 0}

    def short(prompts, completions, **_):
        calls["n"] += 1
        return [1.0] * (len(completions) - 1)

    rs = RewardSet([short, const], max_consecutive_failures=3)
    for _ in range(2):
        out = rs(P, C)
        assert not out.valid.any() and out.metrics["rewards/short/failures"] == 4
    with pytest.raises(RewardError, match="'short' returned 3 values for 4 completions"):
        rs(P, C)


def test_a_good_batch_resets_the_failure_count():
    state = {"bad": True}

    def flaky(prompts, completions, **_):
        return 1.0 if state["bad"] else [1.0] * len(completions)

    rs = RewardSet([flaky], max_consecutive_failures=2)
    rs(P, C)  # one strike (returned a float, not a list)
    state["bad"] = False
    assert rs(P, C).valid.all()
    state["bad"] = True
    rs(P, C)  # one strike again, no error
    with pytest.raises(RewardError, match="returned float"):
        rs(P, C)


def test_always_raising_function_raises_after_strikes():
    def broken(prompts, completions, *, missing_field, **_):
        return [0.0] * len(completions)

    rs = RewardSet([broken], max_consecutive_failures=1)
    with pytest.raises(RewardError, match="raised TypeError"):
        rs(P, C)


def test_construction_errors():
    with pytest.raises(RewardError, match="duplicate"):
        RewardSet([const, const])
    with pytest.raises(RewardError):
        RewardSet([])
    with pytest.raises(RewardError, match="prompts"):
        RewardSet([const])(P[:2], C)


# ----- issue 31: reward functions that exit, hang or overflow --------------------------------


def exits_on_2(prompts, completions, **_):
    """``sys.exit(0)`` on a batch holding completion "2" (and on that sample alone)."""
    import sys

    if "2" in completions:
        sys.exit(0)
    return [1.0] * len(completions)


def interrupts(prompts, completions, **_):
    raise KeyboardInterrupt


def hangs_on_1(prompts, completions, **_):
    import time

    if "1" in completions:
        time.sleep(5)
    return [1.0] * len(completions)


def test_a_reward_calling_sys_exit_fails_only_its_row(caplog):
    out = RewardSet([RewardSpec(exits_on_2, name="ex")])(P, C)
    assert out.valid.tolist() == [True, True, False, True]
    assert out.rewards.tolist() == [1.0, 1.0, 0.0, 1.0]
    assert out.metrics["rewards/ex/errors"] == 1 and out.metrics["rewards/ex/failures"] == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["reward 'ex' failed on 1 of 4 rows (first: row 2: SystemExit: 0)"]


def test_a_reward_raising_keyboard_interrupt_does_not_stop_the_caller():
    out = RewardSet([RewardSpec(interrupts, name="ki")], max_consecutive_failures=2)(P, C)
    assert not out.valid.any() and out.metrics["rewards/ki/errors"] == 4


def test_a_hanging_reward_times_out_on_its_row():
    import time

    t = time.perf_counter()
    out = RewardSet([RewardSpec(hangs_on_1, name="hang", timeout_s=0.3)])(P, C)
    assert time.perf_counter() - t < 3.0  # the batch call and the row's retry: 2 x 0.3 s
    assert out.valid.tolist() == [True, False, True, True]
    assert out.metrics["rewards/hang/timeouts"] == 1


def test_on_error_raise_stops_with_one_line_naming_the_function_and_row():
    from jaxrl_llm.rewards.user_code import UserCodeStop

    rs = RewardSet([RewardSpec(exits_on_2, name="ex", on_error="raise")])
    with pytest.raises(UserCodeStop, match=r"reward function 'ex' failed on row 2: SystemExit: 0"):
        rs(P, C)


def test_a_total_that_overflows_float32_is_invalid_and_counted():
    huge = lambda p, c, **_: [1e308, 1.0, 3e38, 1.0]  # noqa: E731
    out = RewardSet([RewardSpec(huge, name="a"), RewardSpec(huge, name="b")])(P, C)
    assert out.valid.tolist() == [False, True, False, True]  # 2e308 = inf; 6e38 > float32 max
    assert np.isfinite(out.rewards).all() and out.metrics["rewards/total/nonfinite"] == 2
