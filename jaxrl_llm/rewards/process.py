"""Process (per-step) rewards for process supervision.

A completion is split into reasoning steps (by default one step per non-empty line) and a
step scorer gives each step a score, as in process reward models (Lightman et al. 2023,
"Let's Verify Step by Step", https://arxiv.org/abs/2305.20050) and GRPO with process
supervision (Shao et al. 2024, DeepSeekMath §4.1.3, https://arxiv.org/abs/2402.03300), whose
advantage is :func:`jaxrl_llm.objectives.process_advantages`. :func:`pad_step_rewards` turns
the ragged lists into its ``step_rewards`` / ``step_mask`` arrays, and the step end offsets
(characters) let the caller map steps onto tokens (``token_step_ids``).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from jaxrl_llm.errors import RewardError


class StepScorer(Protocol):
    """``scorer(prompt, steps, **fields_of_this_example) -> list[float]`` (one per step)."""

    def __call__(self, prompt: str, steps: list[str], **fields) -> Sequence[float]:
        """One score per reasoning step of one completion."""
        ...


def split_steps(text: str, *, delimiter: str = r"\n+") -> list[tuple[str, int, int]]:
    """Splits a completion into steps: ``(step_text, start, end)`` character spans.

    Args:
      text: completion.
      delimiter: regex separating steps (default: one or more newlines). Empty steps
        (whitespace only) are dropped.

    Returns:
      Steps in order; ``text[start:end] == step_text``.
    """
    steps, pos = [], 0
    for m in re.finditer(delimiter, text):
        if text[pos : m.start()].strip():
            steps.append((text[pos : m.start()], pos, m.start()))
        pos = m.end()
    if text[pos:].strip():
        steps.append((text[pos:], pos, len(text)))
    return steps


def process_rewards(
    scorer: StepScorer,
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    delimiter: str = r"\n+",
    **fields: Sequence,
) -> list[list[float] | None]:
    """Per-step scores of each completion: ``[[r_{i,1}, ..., r_{i,K_i}], ...]``.

    A failing scorer (exception, wrong count, non-finite value) gives None for that
    completion (no score; the caller marks it invalid), never an exception.

    Args:
      scorer: :class:`StepScorer`, called once per completion with its steps' texts and that
        example's fields (``answer=...``).
      prompts, completions: N each.
      delimiter: step separator regex (see :func:`split_steps`).
      **fields: other columns, each of length N.

    Returns:
      N lists of K_i floats (K_i = number of steps, possibly 0), or None where scoring failed.
    """
    n = len(completions)
    if len(prompts) != n or any(len(v) != n for v in fields.values()):
        raise RewardError(f"process rewards: prompts and every field must have {n} entries")
    out: list[list[float] | None] = []
    for i in range(n):
        steps = [s for s, _, _ in split_steps(completions[i], delimiter=delimiter)]
        try:
            scores = list(scorer(prompts[i], steps, **{k: v[i] for k, v in fields.items()}))
        except Exception:  # noqa: BLE001 - one bad sample is scored None
            out.append(None)
            continue
        if len(scores) != len(steps) or not all(
            isinstance(s, numbers.Real) and math.isfinite(float(s)) for s in scores
        ):
            out.append(None)
            continue
        out.append([float(s) for s in scores])
    return out


def pad_step_rewards(
    step_scores: Sequence[Sequence[float] | None], *, max_steps: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Ragged per-step scores → ``(step_rewards [N, S] float32, step_mask [N, S] bool)``.

    None rows (failed scoring) are all-masked. ``S = max_steps`` or the longest row (at least
    1); longer rows are truncated to their first S steps.
    """
    s = max_steps or max([len(r) for r in step_scores if r is not None] + [1])
    rewards = np.zeros((len(step_scores), s), np.float32)
    mask = np.zeros((len(step_scores), s), bool)
    for i, row in enumerate(step_scores):
        if row is None:
            continue
        k = min(len(row), s)
        rewards[i, :k] = row[:k]
        mask[i, :k] = True
    return rewards, mask


def outcome_as_process(
    reward_fn: Callable[..., Sequence[float | None]], *, delimiter: str = r"\n+"
) -> StepScorer:
    """A StepScorer that scores each prefix ``steps[:k]`` with an outcome reward function.

    r_{k} = reward_fn([prompt], [join(steps[:k])], **fields)[0]; useful as a verifiable
    baseline PRM (e.g. "has the correct number appeared yet?").
    """
    joiner = "\n" if delimiter in (r"\n+", r"\n", "\n") else " "

    def scorer(prompt, steps, **fields):
        """Outcome reward of every step prefix."""
        vals = []
        for k in range(1, len(steps) + 1):
            v = reward_fn(
                [prompt], [joiner.join(steps[:k])], **{f: [x] for f, x in fields.items()}
            )[0]
            vals.append(float("nan") if v is None else float(v))
        return vals

    return scorer
