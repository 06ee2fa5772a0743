"""Majority voting over extracted answers (rewards/voting.py): maj@k and the per-prompt
evaluation record, on hand-made completions."""

import math

import pytest

from jaxrl_llm.rewards.voting import (
    extract_votes,
    maj_at_k,
    majority_vote,
    sample_records,
    vote_key,
)


def test_votes_count_a_number_once_whatever_its_spelling():
    assert extract_votes(["so 1,000", "\\boxed{1000.0}", "it is 7", "no answer"]) == [
        "1000",
        "1000",
        "7",
        None,
    ]
    assert vote_key(" x + 1 ") == "x + 1" and vote_key("3/6") == "1/2" and vote_key(None) is None


def test_the_majority_and_its_ties():
    assert majority_vote(["7", "5", "5", None, "7", "5"]) == ("5", 3)
    assert majority_vote(["7", "5", "5", "7"]) == ("7", 2)  # a tie: the answer seen first
    assert majority_vote([None, None]) == (None, 0)


def test_maj_at_k_by_hand():
    # prompt 1: 5, 5, 7, 5 with 5 correct; prompt 2: 3, 4, 4, 3 with 3 correct (a tie, 3 first);
    # prompt 3: 9, 8, 8, 8 with 9 correct (the majority 8 is wrong)
    answers = [["5", "5", "7", "5"], ["3", "4", "4", "3"], ["9", "8", "8", "8"]]
    correct = [
        [a == "5" for a in answers[0]],
        [a == "3" for a in answers[1]],
        [True, False, False, False],
    ]
    assert maj_at_k(answers, correct, 4) == pytest.approx(2 / 3)
    # k = 1: each prompt's first sample: all three correct
    assert maj_at_k(answers, correct, 1) == 1.0
    # k = 3: prompt 2 votes 3, 4, 4 -> 4, wrong; prompt 3: 9, 8, 8 -> 8, wrong
    assert maj_at_k(answers, correct, 3) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="only 4 samples"):
        maj_at_k(answers, correct, 5)


def test_sample_records_hold_prompt_completions_answers_rewards_and_votes():
    prompts = ["2+3?"] * 3 + ["1+1?"] * 3
    completions = ["it is 5", "\\boxed{5}", "6", "2", "two", "3"]
    rewards = [1.0, 1.0, 0.0, 1.0, math.nan, 0.0]
    recs = sample_records(
        prompts, completions, rewards, group_size=3, step=4, references=["5"] * 3 + ["2"] * 3
    )
    assert recs[0] == {
        "step": 4,
        "prompt": "2+3?",
        "reference": "5",
        "completions": ["it is 5", "\\boxed{5}", "6"],
        "answers": ["5", "5", "6"],
        "rewards": [1.0, 1.0, 0.0],
        "votes": {"5": 2, "6": 1},
        "majority": "5",
        "majority_correct": True,
    }
    assert recs[1]["answers"] == ["2", None, "3"] and recs[1]["rewards"] == [1.0, None, 0.0]
    assert recs[1]["votes"] == {"2": 1, "3": 1} and recs[1]["majority"] == "2"
    assert recs[1]["majority_correct"] is True
    with pytest.raises(ValueError, match="groups of 4"):
        sample_records(prompts, completions, rewards, group_size=4, step=0)
