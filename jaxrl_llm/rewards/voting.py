"""Majority voting over extracted answers (self-consistency) and the per-sample evaluation record.

maj@k: for each prompt, the answers extracted from k sampled completions are counted and the most
frequent one is the prompt's answer; the prompt counts as solved when a completion carrying that
answer is correct (its reward is 1). Self-consistency, Wang et al. 2022
(https://arxiv.org/abs/2203.11171); "maj1@k" in Minerva (Lewkowycz et al. 2022,
https://arxiv.org/abs/2206.14858). With n ≥ k samples per prompt the first k are voted on (one
draw of k, an unbiased estimate of maj@k for i.i.d. samples).

Answers are compared after :func:`vote_key`: a number by its value (``"1,000"``, ``"1000.0"``
and ``"\\boxed{1000}"`` are one vote), other text stripped. A completion with no answer casts
no vote; a prompt with no vote is unsolved.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_llm.rewards.math_answer import extract_answer, parse_number


def vote_key(answer: str | None) -> str | None:
    """The form answers are counted in: a number's exact value (``"3/2"``), else the stripped
    text; None for no answer."""
    if answer is None:
        return None
    number = parse_number(answer)
    if number is not None:
        return str(number)
    text = answer.strip()
    return text or None


def extract_votes(completions: Sequence[str]) -> list[str | None]:
    """Each completion's answer (:func:`~jaxrl_llm.rewards.math_answer.extract_answer`: the
    last ``\\boxed{}``, else the last number) in :func:`vote_key` form."""
    return [vote_key(extract_answer(c)[0]) for c in completions]


def majority_vote(answers: Sequence[str | None]) -> tuple[str | None, int]:
    """The most frequent answer that is not None and its count; a tie goes to the answer seen
    first. ``(None, 0)`` when no answer was given."""
    counts = collections.Counter(a for a in answers if a is not None)
    if not counts:
        return None, 0
    top = max(counts.values())
    winner = next(a for a in answers if a is not None and counts[a] == top)
    return winner, top


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Whether the majority answer of ``answers`` is correct: the first completion that carries
    it has ``correct`` True."""
    winner, _ = majority_vote(answers)
    if winner is None:
        return False
    return bool(correct[list(answers).index(winner)])


def maj_at_k(
    answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]], k: int
) -> float:
    """maj@k over prompts: the share whose majority answer among their first ``k`` samples is
    correct (module docstring).

    Args:
      answers: per prompt, n ≥ k answers (:func:`extract_votes`).
      correct: per prompt, n booleans (the sample's reward is 1).
      k: samples voted on.
    """
    if k < 1:
        raise ValueError(f"maj@k: k must be >= 1, got {k}")
    solved = []
    for a, c in zip(answers, correct, strict=True):
        if len(a) < k:
            raise ValueError(f"maj@{k}: a prompt has only {len(a)} samples")
        solved.append(majority_correct(a[:k], c[:k]))
    return float(np.mean(solved)) if solved else float("nan")


def sample_records(
    prompts: Sequence[Any],
    completions: Sequence[str],
    rewards: Sequence[float],
    *,
    group_size: int,
    step: int,
    references: Sequence[Any] | None = None,
) -> list[dict]:
    """One JSON-ready record per prompt of an evaluation (``eval/samples-<step>.jsonl``):
    ``step``, ``prompt``, ``reference`` (when given), ``completions``, ``answers`` (extracted,
    :func:`vote_key` form), ``rewards`` (NaN written as None: not scored), ``votes`` (answer →
    count), ``majority`` and ``majority_correct``.

    Args:
      prompts, completions, rewards: N = prompts × ``group_size`` rows, a prompt's samples
        consecutive (``prompts`` repeats each prompt ``group_size`` times).
      references: N reference answers (the ``answer`` column), or None.
    """
    n = len(completions)
    if n % group_size or len(prompts) != n or len(rewards) != n:
        raise ValueError(
            f"sample_records: {len(prompts)} prompts, {n} completions and {len(rewards)} "
            f"rewards do not form groups of {group_size}"
        )
    answers = extract_votes(completions)
    out = []
    for start in range(0, n, group_size):
        rows = range(start, start + group_size)
        a = [answers[i] for i in rows]
        r = [None if not np.isfinite(rewards[i]) else float(rewards[i]) for i in rows]
        winner, _ = majority_vote(a)
        record: dict[str, Any] = {"step": int(step), "prompt": prompts[start]}
        if references is not None:
            record["reference"] = references[start]
        record.update(
            completions=[completions[i] for i in rows],
            answers=a,
            rewards=r,
            votes=dict(collections.Counter(x for x in a if x is not None)),
            majority=winner,
            majority_correct=majority_correct(a, [x == 1.0 for x in r]),
        )
        out.append(record)
    return out
