"""Format and length rewards (reward shaping that needs no reference answer)."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence

from jaxrl_llm.errors import ConfigError

THINK_ANSWER_PATTERN = r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$"
"""DeepSeek-R1's format: reasoning in <think>...</think>, then <answer>...</answer>."""


def make_format_reward(
    pattern: str = THINK_ANSWER_PATTERN,
    *,
    flags: int = re.DOTALL,
    full_match: bool = False,
    reward: float = 1.0,
    penalty: float = 0.0,
) -> Callable[..., list[float]]:
    """A reward function: ``reward`` if the completion matches ``pattern``, else ``penalty``.

    The format reward of DeepSeek-R1 (https://arxiv.org/abs/2501.12948), whose default
    pattern requires ``<think>...</think><answer>...</answer>``.

    Args:
      pattern: regular expression (searched with ``re.search``; anchor it for a full match).
      flags: ``re`` flags (default DOTALL, so ``.`` spans lines).
      full_match: use ``re.fullmatch`` instead of ``re.search``.
      reward, penalty: values for a match and a miss.

    Returns:
      ``fn(prompts, completions, **fields) -> list[float]``.
    """
    try:
        compiled = re.compile(pattern, flags)
    except re.error as e:
        raise ConfigError(f"format reward: invalid regex {pattern!r}: {e}") from None
    match = compiled.fullmatch if full_match else compiled.search

    def format_reward(prompts, completions, **_fields):
        """``reward`` where the completion matches the pattern, else ``penalty``."""
        return [reward if match(c) else penalty for c in completions]

    return format_reward


def make_length_penalty(
    *,
    target: int,
    coef: float = 0.001,
    max_penalty: float | None = None,
    count: Callable[[str], int] = len,
) -> Callable[..., list[float]]:
    """Linear length penalty beyond a target: r = −coef · max(0, L − target), floored at −max_penalty.

    Args:
      target: length (in ``count`` units, default characters) allowed for free.
      coef: penalty per unit beyond the target.
      max_penalty: largest penalty magnitude (None: unbounded).
      count: length function, e.g. ``lambda s: len(tokenizer.encode(s))`` for tokens.

    Returns:
      ``fn(prompts, completions, **fields) -> list[float]`` with values ≤ 0.
    """
    if target < 0 or coef < 0 or (max_penalty is not None and max_penalty < 0):
        raise ConfigError("length penalty: target, coef and max_penalty must be >= 0")

    def length_penalty(prompts, completions, **_fields):
        """−coef · max(0, length − target)."""
        out = []
        for c in completions:
            p = coef * max(0, count(c) - target)
            out.append(-(p if max_penalty is None else min(p, max_penalty)))
        return out

    return length_penalty


class LengthUnit(str, enum.Enum):
    """Unit of a length-based reward."""

    CHARS = "chars"
    TOKENS = "tokens"


def make_overlong_reward(
    *,
    max_len: int,
    buffer: int,
    unit: LengthUnit | str = LengthUnit.CHARS,
    tokenizer: Callable[[str], Sequence[int]] | None = None,
) -> Callable[..., list[float]]:
    """DAPO's soft overlong punishment as a reward function (values in [−1, 0]).

        R(L) = 0                         if L ≤ max_len − buffer
             = (max_len − buffer − L) / buffer   if max_len − buffer < L ≤ max_len
             = −1                        if L > max_len

    Yu et al. 2025, "DAPO", https://arxiv.org/abs/2503.14476 (Eq. 13; L_max = 20480 tokens,
    L_cache = 4096 in the paper). The formula itself is
    :func:`jaxrl_llm.objectives.overlong_penalty` (imported lazily); this wrapper only measures
    the lengths, in characters or in tokens (``tokenizer(text) -> ids``).

    Args:
      max_len: L_max. buffer: L_cache (the soft zone before L_max).
      unit: ``chars`` or ``tokens`` (then ``tokenizer`` is required).
      tokenizer: callable text → token ids (e.g. ``lambda s: tok(s)["input_ids"]``).

    Returns:
      ``fn(prompts, completions, **fields) -> list[float]``.
    """
    unit = LengthUnit(unit)
    if unit == LengthUnit.TOKENS and tokenizer is None:
        raise ConfigError("overlong reward: unit='tokens' needs a tokenizer (text -> ids)")
    if not 0 < buffer <= max_len:
        raise ConfigError(
            f"overlong reward: need 0 < buffer <= max_len, got buffer={buffer}, max_len={max_len}"
        )

    def overlong_reward(prompts, completions, **_fields):
        """DAPO soft overlong punishment of each completion's length."""
        import jax.numpy as jnp
        import numpy as np

        from jaxrl_llm.objectives import overlong_penalty  # lazy: objectives is a sibling layer

        if unit == LengthUnit.TOKENS:
            assert tokenizer is not None  # checked when the reward was built
            lengths = [len(tokenizer(c)) for c in completions]
        else:
            lengths = [len(c) for c in completions]
        values = overlong_penalty(jnp.asarray(lengths, jnp.int32), max_len=max_len, buffer=buffer)
        return [float(v) for v in np.asarray(values)]

    return overlong_reward
