"""The reward-function interface and a safe, weighted combiner.

A reward function is any callable

    fn(prompts: list[str], completions: list[str], **fields) -> list[float | None]

where ``fields`` are the data set's other columns, each a list aligned with the completions
(``answer=[...]``, ``tests=[...]``); it returns one float per completion, or None for "no
score". Functions should accept ``**fields`` they do not use.

:class:`RewardSet` calls several of them and never lets one bad sample stop training:

- a value that is None, NaN/Inf, or not a real number marks that sample invalid;
- if the batch call raises, the function is retried one sample at a time so that only the
  samples that raise are invalid;
- a return value that is not a sequence, or has the wrong length, marks the whole batch
  invalid for that function (a *batch failure*).

A sample is valid when every function scored it; invalid samples get reward 0 and
``valid=False`` (the RL loop gives them zero advantage). Systematic misuse raises
:class:`~jaxrl_llm.errors.RewardError`: when the same function has a batch failure (wrong
length / type, or every sample raising) in ``max_consecutive_failures`` consecutive calls
(default 3), the error names the function and the last problem. One bad batch is tolerated.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from jaxrl_llm.errors import RewardError


class RewardFn(Protocol):
    """``fn(prompts, completions, **fields) -> list[float | None]`` (one value per completion)."""

    def __call__(
        self, prompts: list[str], completions: list[str], **fields: Any
    ) -> Sequence[float | None]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class RewardSpec:
    """One reward function in a :class:`RewardSet`.

    Attributes:
      fn: the reward function.
      weight: its weight in the total (total = Σ_k weight_k · r_k).
      name: metric prefix; default the function's ``__name__``.
    """

    fn: Callable[..., Sequence[float | None]]
    weight: float = 1.0
    name: str | None = None

    def __post_init__(self):
        if not callable(self.fn):
            raise RewardError(f"reward {self.name or self.fn!r} is not callable")
        if not math.isfinite(float(self.weight)):
            raise RewardError(f"reward {self.label}: weight must be finite, got {self.weight}")

    @property
    def label(self) -> str:
        """The metric prefix."""
        if self.name:
            return self.name
        fn = self.fn
        while hasattr(fn, "func"):  # functools.partial
            fn = fn.func
        return getattr(fn, "__name__", type(fn).__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class RewardOutput:
    """What a :class:`RewardSet` returns.

    Attributes:
      rewards: ``[N]`` float32, Σ_k weight_k · r_k for valid samples, 0 for invalid ones.
      valid: ``[N]`` bool, every function scored the sample.
      per_function: name → ``[N]`` float32 raw scores (NaN where that function failed).
      metrics: flat dict of floats: ``rewards/<name>/mean``, ``/std`` (over its valid
        samples), ``/failures`` (count), ``/accuracy`` (fraction of valid scores == 1, only
        when every valid score is 0 or 1), and ``rewards/total/mean``, ``rewards/valid_frac``.
    """

    rewards: np.ndarray
    valid: np.ndarray
    per_function: dict[str, np.ndarray]
    metrics: dict[str, float]

    def __iter__(self):
        """Unpacks as ``rewards, valid, metrics``."""
        return iter((self.rewards, self.valid, self.metrics))


def _to_float(v: Any) -> float | None:
    """A finite float, or None if ``v`` is None, not a real number, or not finite."""
    if v is None or isinstance(v, (str, bytes)):
        return None
    if isinstance(v, np.ndarray) or hasattr(v, "ndim"):
        if getattr(v, "ndim", 1) != 0:
            return None
        v = v.item() if hasattr(v, "item") else float(v)
    if not isinstance(v, numbers.Real):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


class RewardSet:
    """Weighted sum of reward functions that contains their failures (see module docstring).

    Example::

        rewards = RewardSet([(math_answer_reward, 1.0), (make_format_reward(), 0.2)])
        out = rewards(prompts, completions, answer=answers)
        r, valid, metrics = out

    Args:
      specs: ``RewardSpec``s, ``(fn, weight)`` pairs, or bare functions (weight 1).
      max_consecutive_failures: batch failures in a row of one function before RewardError.
    """

    def __init__(
        self, specs: Sequence[RewardSpec | tuple | Callable], *, max_consecutive_failures: int = 3
    ):
        parsed = []
        for s in specs:
            if isinstance(s, RewardSpec):
                parsed.append(s)
            elif isinstance(s, tuple):
                parsed.append(RewardSpec(*s))
            else:
                parsed.append(RewardSpec(s))
        if not parsed:
            raise RewardError("RewardSet needs at least one reward function")
        labels = [s.label for s in parsed]
        dup = {x for x in labels if labels.count(x) > 1}
        if dup:
            raise RewardError(
                f"RewardSet: duplicate reward names {sorted(dup)}; pass "
                f"RewardSpec(fn, weight, name=...) to tell them apart"
            )
        if max_consecutive_failures < 1:
            raise RewardError("RewardSet: max_consecutive_failures must be >= 1")
        self.specs: tuple[RewardSpec, ...] = tuple(parsed)
        self.max_consecutive_failures = max_consecutive_failures
        self._strikes = {s.label: 0 for s in parsed}

    def _score_one_fn(
        self,
        spec: RewardSpec,
        prompts: list[str],
        completions: list[str],
        fields: Mapping[str, Sequence[Any]],
    ) -> tuple[np.ndarray, str | None]:
        """Raw scores ``[N]`` (NaN = failed) and a batch-failure message or None."""
        n = len(completions)
        scores = np.full((n,), np.nan, np.float64)
        try:
            out = spec.fn(prompts, completions, **fields)
        except Exception as e:  # noqa: BLE001 - retried per sample below
            batch_error = e
        else:
            if isinstance(out, (str, bytes)) or not isinstance(out, (Sequence, np.ndarray)):
                return scores, f"returned {type(out).__name__}, expected a list of {n} floats"
            if len(out) != n:
                return scores, f"returned {len(out)} values for {n} completions"
            for i, v in enumerate(out):
                f = _to_float(v)
                if f is not None:
                    scores[i] = f
            return scores, None
        failed = 0
        for i in range(n):
            sub = {k: [v[i]] for k, v in fields.items()}
            try:
                out = spec.fn([prompts[i]], [completions[i]], **sub)
            except Exception:  # noqa: BLE001 - one bad sample is scored invalid
                failed += 1
                continue
            if (
                isinstance(out, (Sequence, np.ndarray))
                and not isinstance(out, (str, bytes))
                and len(out) == 1
            ):
                f = _to_float(out[0])
                if f is not None:
                    scores[i] = f
        if failed == n:
            return scores, (f"raised {type(batch_error).__name__}: {batch_error} for every sample")
        return scores, None

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], **fields: Sequence[Any]
    ) -> RewardOutput:
        """Scores a batch; see :class:`RewardOutput`.

        Args:
          prompts: N prompts. completions: N completions.
          **fields: other columns, each of length N.

        Raises:
          RewardError: misaligned inputs, or a function failed as a whole
            ``max_consecutive_failures`` times in a row.
        """
        prompts, completions = list(prompts), list(completions)
        n = len(completions)
        if len(prompts) != n:
            raise RewardError(
                f"rewards: {len(prompts)} prompts for {n} completions; repeat "
                f"each prompt once per sample"
            )
        fields = {k: list(v) for k, v in fields.items()}
        for k, v in fields.items():
            if len(v) != n:
                raise RewardError(
                    f"rewards: field {k!r} has {len(v)} values for {n} "
                    f"completions; every column must be aligned"
                )
        total = np.zeros((n,), np.float64)
        valid = np.ones((n,), bool)
        per_function: dict[str, np.ndarray] = {}
        metrics: dict[str, float] = {}
        for spec in self.specs:
            name = spec.label
            scores, problem = self._score_one_fn(spec, prompts, completions, fields)
            if problem is None:
                self._strikes[name] = 0
            else:
                self._strikes[name] += 1
                if self._strikes[name] >= self.max_consecutive_failures:
                    fix = (
                        "make it return None for a sample it cannot score instead of raising"
                        if problem.startswith("raised")
                        else "return one value per completion"
                    )
                    raise RewardError(
                        f"reward function {name!r} {problem} in "
                        f"{self._strikes[name]} consecutive batches; {fix}: "
                        f"fn(prompts, completions, **fields) -> "
                        f"list[float | None]"
                    )
            ok = np.isfinite(scores)
            valid &= ok
            total += np.where(ok, spec.weight * np.nan_to_num(scores), 0.0)
            per_function[name] = scores.astype(np.float32)
            good = scores[ok]
            metrics[f"rewards/{name}/mean"] = float(good.mean()) if good.size else 0.0
            metrics[f"rewards/{name}/std"] = float(good.std()) if good.size else 0.0
            metrics[f"rewards/{name}/failures"] = float(n - good.size)
            if good.size and np.all((good == 0.0) | (good == 1.0)):
                metrics[f"rewards/{name}/accuracy"] = float(good.mean())
        rewards = np.where(valid, total, 0.0).astype(np.float32)
        metrics["rewards/total/mean"] = float(rewards[valid].mean()) if valid.any() else 0.0
        metrics["rewards/valid_frac"] = float(valid.mean()) if n else 1.0
        return RewardOutput(
            rewards=rewards, valid=valid, per_function=per_function, metrics=metrics
        )


def combine_rewards(
    specs: Sequence[RewardSpec | tuple | Callable], *, max_consecutive_failures: int = 3
) -> RewardSet:
    """``RewardSet(specs)``: a callable ``(prompts, completions, **fields) -> RewardOutput``.

    Args:
      specs: ``[(fn, weight), ...]``, ``RewardSpec``s or bare functions.
      max_consecutive_failures: see :class:`RewardSet`.
    """
    return RewardSet(specs, max_consecutive_failures=max_consecutive_failures)
