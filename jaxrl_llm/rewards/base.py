"""A safe, weighted combiner of reward functions (called by TRL's convention,
:mod:`jaxrl_llm.rewards.calling`).

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
import logging
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from jaxrl_llm.errors import RewardError
from jaxrl_llm.rewards.calling import (
    CALL_KEYWORDS,
    TrainerState,
    call_reward,
    call_shape,
    trl_format,
)
from jaxrl_llm.rewards.user_code import (
    STOPPING,
    CallResult,
    UserCodeStop,
    check_timeout,
    shared_runner,
)

OnError = Literal["invalid", "raise"]
#: Seconds a reward call may take by default (:attr:`RewardSpec.timeout_s`).
DEFAULT_TIMEOUT_S = 300.0
log = logging.getLogger("jaxrl_llm")


@dataclasses.dataclass(frozen=True, slots=True)
class RewardSpec:
    """One reward function in a :class:`RewardSet`.

    Attributes:
      fn: the reward function.
      weight: its weight in the total (total = Σ_k weight_k · r_k).
      name: metric prefix; default the function's ``__name__``.
      timeout_s: seconds one call may take (None: no limit); a call past it scores its samples
        invalid (``rewards/<name>/timeouts``). Default 300 s: a batch of sandboxed programs or
        a reward model's first (compiling) call fits.
      on_error: ``invalid`` (a sample the function raises on, times out on or cannot score is
        invalid, reward 0) or ``raise`` (the first such failure stops the run:
        :class:`~jaxrl_llm.rewards.user_code.UserCodeStop`).
      conversational: called as TRL calls a reward function: for a row whose prompt is a
        list of chat messages, its prompt is that list and its completion
        ``[{"role": "assistant", "content": text}]`` (:func:`trl_format`); text otherwise.
        False: always the rendered prompt and completion texts (the built-ins).
    """

    fn: Callable[..., Sequence[float | None]]
    weight: float = 1.0
    name: str | None = None
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    on_error: OnError = "invalid"
    conversational: bool = False

    def __post_init__(self):
        if not callable(self.fn):
            raise RewardError(f"reward {self.name or self.fn!r} is not callable")
        if not math.isfinite(float(self.weight)):
            raise RewardError(f"reward {self.label}: weight must be finite, got {self.weight}")
        try:
            check_timeout(self.timeout_s, f"reward {self.label}: timeout_s")
        except ValueError as e:
            raise RewardError(str(e)) from None
        if self.on_error not in ("invalid", "raise"):
            raise RewardError(
                f"reward {self.label}: on_error is invalid | raise, got {self.on_error!r}"
            )

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
      encode: ``text -> token ids`` of the policy: the ``completion_ids`` of a call whose
        caller does not pass the sampled ids are the completions re-encoded (None: no
        ``completion_ids`` then).

    Attributes:
      state: the :class:`TrainerState` passed as ``trainer_state`` when a call gives none; the
        loop that runs the set advances it (:meth:`advance`).
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec | tuple | Callable],
        *,
        max_consecutive_failures: int = 3,
        encode: Callable[[str], Sequence[int]] | None = None,
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
        self.encode = encode
        self.state = TrainerState()
        self._strikes = {s.label: 0 for s in parsed}
        self._shapes = {s.label: call_shape(s.fn) for s in parsed}

    def advance(self, step: int, epoch: float = 0.0, max_steps: int = 0) -> None:
        """Set :attr:`state` (the step being trained, the data epoch, the run's last step)."""
        self.state = TrainerState(step=int(step), epoch=float(epoch), max_steps=int(max_steps))

    def _call(
        self, spec: RewardSpec, prompts: list, completions: list, extra: Mapping[str, Any]
    ) -> CallResult:
        """One call of ``spec.fn`` on the reward threads, bounded by ``spec.timeout_s``."""
        runner = shared_runner("reward")
        shape = self._shapes[spec.label]
        return runner.call(
            lambda: call_reward(spec.fn, shape, prompts, completions, extra),
            timeout_s=spec.timeout_s,
        )

    def _score_one_fn(
        self,
        spec: RewardSpec,
        prompts: list[str],
        completions: list[str],
        fields: Mapping[str, Sequence[Any]],
        shared: Mapping[str, Any],
    ) -> tuple[np.ndarray, str | None, dict[str, int]]:
        """Raw scores ``[N]`` (NaN = failed), a batch-failure message or None, and the counts
        of calls that raised / timed out. User code never raises here (see
        :mod:`jaxrl_llm.rewards.user_code`); with ``on_error: raise`` its first failure is a
        :class:`UserCodeStop`. ``fields`` are per row (the data columns, ``completion_ids``),
        ``shared`` the same for every row (``trainer_state``)."""
        n = len(completions)
        scores = np.full((n,), np.nan, np.float64)
        counts = {"errors": 0, "timeouts": 0}
        res = self._call(spec, prompts, completions, {**fields, **shared})
        if res.ok:
            out = res.value
            if isinstance(out, (str, bytes)) or not isinstance(out, (Sequence, np.ndarray)):
                return (
                    scores,
                    f"returned {type(out).__name__}, expected a list of {n} floats",
                    counts,
                )
            if len(out) != n:
                return scores, f"returned {len(out)} values for {n} completions", counts
            for i, v in enumerate(out):
                f = _to_float(v)
                if f is not None:
                    scores[i] = f
            return scores, None, counts
        if res.error == "interrupted":  # the run is stopping: no retries
            return scores, None, counts
        # retried one sample at a time, so that only the samples that fail are invalid
        failed, first = 0, None
        for i in range(n):
            sub = {k: [v[i]] for k, v in fields.items()}
            one = self._call(spec, [prompts[i]], [completions[i]], {**sub, **shared})
            if not one.ok:
                failed += 1
                first = first or (i, one.error)
                self._failed(spec, one, i, counts)
                if one.error == "interrupted" or counts["timeouts"] >= max(2, n // 4):
                    failed += n - i - 1  # a function that keeps hanging is not waited on
                    break
                continue
            out = one.value
            if (
                isinstance(out, (Sequence, np.ndarray))
                and not isinstance(out, (str, bytes))
                and len(out) == 1
            ):
                f = _to_float(out[0])
                if f is not None:
                    scores[i] = f
        if first is not None and not STOPPING.is_set():
            log.warning(
                "reward %r failed on %d of %d rows (first: row %d: %s)",
                spec.label,
                failed,
                n,
                first[0],
                first[1],
            )
        if failed == n:
            return scores, f"raised {res.error} for every sample", counts
        return scores, None, counts

    def _failed(self, spec: RewardSpec, res: CallResult, row: int, counts: dict) -> None:
        """Count a row whose call failed; with ``on_error: raise``, stop the run."""
        counts["timeouts" if res.timed_out else "errors"] += 1
        if spec.on_error == "raise" and res.error != "interrupted":
            raise UserCodeStop(
                f"reward function {spec.label!r} failed on row {row}: {res.error} "
                f"(rewards on_error: raise; set it to invalid to score such rows 0 and go on)"
            )

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        *,
        sources: Sequence[Any] | None = None,
        completion_ids: Any = None,  # Sequence[Sequence[int]] | None
        trainer_state: Any = None,  # TrainerState | None
        **fields: Sequence[Any],
    ) -> RewardOutput:
        """Scores a batch; see :class:`RewardOutput`.

        Args:
          prompts: N prompts (rendered text). completions: N completions (text).
          sources: N prompts as the data rows gave them (text or chat messages): what a
            ``conversational`` function receives for a conversational row (:func:`trl_format`).
          completion_ids: N completions' sampled token ids (default: the texts re-encoded by
            ``encode``, when the set has one and a function takes them).
          trainer_state: passed as ``trainer_state`` (default :attr:`state`).
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
        fields = {k: list(v) for k, v in fields.items() if k not in CALL_KEYWORDS}
        ids = self._completion_ids(completions, completion_ids)
        if ids is not None:
            fields["completion_ids"] = ids
        shared = {"trainer_state": self.state if trainer_state is None else trainer_state}
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
        trl = None
        for spec in self.specs:
            name = spec.label
            args = (prompts, completions)
            if spec.conversational and sources is not None:
                trl = trl or trl_format(prompts, completions, sources)
                args = trl
            scores, problem, counts = self._score_one_fn(spec, *args, fields, shared)
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
                        f"fn(prompts, completions, **kwargs) -> "
                        f"list[float | None]"
                    )
            with np.errstate(over="ignore", invalid="ignore"):  # huge finite scores
                ok = np.isfinite(scores)
                valid &= ok
                total += np.where(ok, spec.weight * np.nan_to_num(scores), 0.0)
                per_function[name] = scores.astype(np.float32)
                good = scores[ok]
                metrics[f"rewards/{name}/mean"] = float(good.mean()) if good.size else 0.0
                metrics[f"rewards/{name}/std"] = float(good.std()) if good.size else 0.0
                metrics[f"rewards/{name}/failures"] = float(n - good.size)
            metrics[f"rewards/{name}/errors"] = float(counts["errors"])
            metrics[f"rewards/{name}/timeouts"] = float(counts["timeouts"])
            if good.size and np.all((good == 0.0) | (good == 1.0)):
                metrics[f"rewards/{name}/accuracy"] = float(good.mean())
        # each score is finite; their weighted sum may still overflow (1e308 + 1e308), or
        # not fit the float32 the update trains on
        with np.errstate(over="ignore"):
            overflow = valid & ~np.isfinite(total.astype(np.float32))
        valid &= ~overflow
        metrics["rewards/total/nonfinite"] = float(overflow.sum())
        rewards = np.where(valid, total, 0.0).astype(np.float32)
        metrics["rewards/total/mean"] = float(rewards[valid].mean()) if valid.any() else 0.0
        metrics["rewards/valid_frac"] = float(valid.mean()) if n else 1.0
        return RewardOutput(
            rewards=rewards, valid=valid, per_function=per_function, metrics=metrics
        )

    def _completion_ids(
        self, completions: list[str], given: Sequence[Sequence[int]] | None
    ) -> list[list[int]] | None:
        """The ``completion_ids`` of a call: ``given``, or the texts re-encoded when some
        function takes them (None when none does or the set cannot encode)."""
        if given is not None:
            return [list(x) for x in given]
        if self.encode is None or not any(s.wants("completion_ids") for s in self._shapes.values()):
            return None
        return [list(self.encode(c)) for c in completions]


def combine_rewards(
    specs: Sequence[RewardSpec | tuple | Callable], *, max_consecutive_failures: int = 3
) -> RewardSet:
    """``RewardSet(specs)``: a callable ``(prompts, completions, **fields) -> RewardOutput``.

    Args:
      specs: ``[(fn, weight), ...]``, ``RewardSpec``s or bare functions.
      max_consecutive_failures: see :class:`RewardSet`.
    """
    return RewardSet(specs, max_consecutive_failures=max_consecutive_failures)
