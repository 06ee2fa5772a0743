"""Format, length and overlong rewards."""

import pytest

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.rewards import make_format_reward, make_length_penalty, make_overlong_reward


def test_think_answer_format():
    fn = make_format_reward()
    comps = [
        "<think>a\nb</think> <answer>4</answer>",
        "<answer>4</answer>",
        "<think>x</think><answer>4</answer> trailing",
        "  <think></think>\n<answer></answer>\n",
    ]
    assert fn([""] * 4, comps) == [1.0, 0.0, 0.0, 1.0]


def test_custom_pattern_reward_and_penalty():
    fn = make_format_reward(r"\d+", full_match=True, reward=0.5, penalty=-1.0)
    assert fn(["", ""], ["123", "12a"]) == [0.5, -1.0]
    with pytest.raises(ConfigError, match="invalid regex"):
        make_format_reward("(")


def test_linear_length_penalty():
    fn = make_length_penalty(target=5, coef=0.5, max_penalty=2.0)
    assert fn([""] * 4, ["abc", "abcde", "abcdefg", "a" * 100]) == [0.0, 0.0, -1.0, -2.0]
    words = make_length_penalty(target=2, coef=1.0, count=lambda s: len(s.split()))
    assert words(["", ""], ["a b", "a b c d"]) == [0.0, -2.0]


def test_overlong_chars_and_tokens():
    fn = make_overlong_reward(max_len=10, buffer=4)
    # start of the soft zone = 6: 6 -> 0, 8 -> -0.5, 10 -> -1, 11 -> -1
    assert fn([""] * 4, ["a" * 6, "a" * 8, "a" * 10, "a" * 11]) == [0.0, -0.5, -1.0, -1.0]
    tok = make_overlong_reward(max_len=4, buffer=2, unit="tokens", tokenizer=str.split)
    assert tok(["", ""], ["a b", "a b c"]) == [0.0, -0.5]


def test_overlong_config_errors():
    with pytest.raises(ConfigError, match="tokenizer"):
        make_overlong_reward(max_len=10, buffer=2, unit="tokens")
    with pytest.raises(ConfigError, match="buffer"):
        make_overlong_reward(max_len=10, buffer=0)
