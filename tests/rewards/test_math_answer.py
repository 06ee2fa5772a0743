"""Answer extraction and numeric equivalence (hand-written cases, including tricky ones)."""

import fractions

import pytest

from jaxrl_llm.rewards import (
    AnswerSource,
    answers_match,
    extract_answer,
    extract_boxed,
    math_answer_reward,
    parse_number,
)


@pytest.mark.parametrize(
    "text,expected,source",
    [
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", AnswerSource.GSM8K),
        ("first 10 then\n#### -1,234", "-1,234", AnswerSource.GSM8K),
        ("so the answer is \\boxed{\\frac{3}{4}}.", "\\frac{3}{4}", AnswerSource.BOXED),
        ("\\boxed{1} wait, no: \\boxed{x^{2}+{1}}", "x^{2}+{1}", AnswerSource.BOXED),
        ("The total is 1,234.", "1,234", AnswerSource.LAST_NUMBER),
        ("Between 5-3 and more", "3", AnswerSource.LAST_NUMBER),  # '-' after a digit is minus
        ("It costs -7 dollars", "-7", AnswerSource.LAST_NUMBER),
        ("She keeps 3/4 of it", "3/4", AnswerSource.LAST_NUMBER),
        ("about .5 litres", ".5", AnswerSource.LAST_NUMBER),
        ("no digits here", None, None),
    ],
)
def test_extract_answer(text, expected, source):
    assert extract_answer(text) == (expected, source)


def test_boxed_unbalanced_is_none():
    assert extract_boxed("\\boxed{12") is None
    assert extract_boxed("\\boxed{{a}{b}}") == "{a}{b}"


@pytest.mark.parametrize(
    "a,b",
    [
        ("1,234", "1234.0"),
        ("3/4", 0.75),
        ("\\frac{3}{4}", "0.75"),
        ("-5", "−5"),
        ("$1,000", "1000"),
        ("50%", "50"),
        ("007", 7),
        ("2.50", "5/2"),
        (" 42. ", "#### 42"),
        ("\\dfrac{-6}{8}", "-0.75"),
    ],
)
def test_numeric_equivalence(a, b):
    assert answers_match(a, b)


@pytest.mark.parametrize(
    "a,b",
    [
        ("12,34", "1234"),  # not a thousands separator
        ("0.33", "1/3"),  # exact by default
        ("-5", "5"),
        ("1/0", "0"),
        ("72", "#### 27"),
        (None, "1"),
    ],
)
def test_numeric_non_equivalence(a, b):
    assert not answers_match(a, b)


def test_parse_number_exact_and_tolerance():
    assert parse_number("-1,234.5") == fractions.Fraction(-2469, 2)
    assert parse_number("1e3") is None
    assert answers_match("0.333", "1/3", rel_tol=1e-2)
    assert not answers_match("0.3", "1/3", rel_tol=1e-2)


def test_non_numeric_answers_compare_as_strings():
    assert answers_match("x^2 + 1", "x^2+1")
    assert not answers_match("x^2", "x^3")


def test_math_answer_reward_lenient_and_strict():
    completions = ["42", " 42.\n", "The answer is 42", "**42**", "41", "I think 4 then 42"]
    lenient = math_answer_reward([""] * 6, completions, answer=["#### 42"] * 6)
    strict = math_answer_reward([""] * 6, completions, answer=["#### 42"] * 6, strict=True)
    assert lenient == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert strict == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_math_answer_reward_none_reference_is_no_score():
    assert math_answer_reward(["", ""], ["1", "2"], answer=[None, 2]) == [None, 1.0]
