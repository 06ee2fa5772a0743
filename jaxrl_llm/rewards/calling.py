"""TRL's reward calling convention: how a reward function is called, and what it is given.

A reward function is any callable, called as TRL's ``GRPOTrainer`` calls one, by keyword::

    fn(prompts=[...], completions=[...], completion_ids=[[...], ...], trainer_state=state,
       **fields) -> list[float | None]

where ``fields`` are the data set's other columns, each a list aligned with the completions
(``answer=[...]``, ``tests=[...]``), ``completion_ids`` the completions' token ids and
``trainer_state`` a :class:`TrainerState` (``step``, ``epoch``); it returns one float per
completion, or None for "no score". A function receives the keywords it names, all of them when
it takes ``**kwargs`` (TRL's documented ``def reward_len(completions, **kwargs)`` runs as
written). A function that names none of those four keywords and takes two or more positional
parameters (``def fn(p, c, **kw)``, or one without a signature) gets the prompts and completions
positionally (:func:`call_shape`). Conversational rows are passed as TRL passes them, message
lists (:func:`trl_format`). :mod:`jaxrl_llm.rewards.base` calls them safely, with weights.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from jaxrl_llm.errors import RewardError


class RewardFn(Protocol):
    """``fn(prompts=, completions=, completion_ids=, trainer_state=, **fields) ->
    list[float | None]`` (one value per completion; module docstring)."""

    def __call__(
        self, prompts: list[str], completions: list[str], **fields: Any
    ) -> Sequence[float | None]:
        """One score (or None) per completion."""
        ...


@dataclasses.dataclass(slots=True)
class TrainerState:
    """Where the run is, passed to reward functions as ``trainer_state`` (TRL passes its
    ``transformers.TrainerState`` there; ``global_step`` and ``epoch`` are what reward
    functions read of it, e.g. for a curriculum).

    Attributes:
      step: the optimizer step being trained (1-based; 0 before the first).
      epoch: passes over the training prompts so far (fractional).
      max_steps: the run's last step (0 when unknown).
    """

    step: int = 0
    epoch: float = 0.0
    max_steps: int = 0

    @property
    def global_step(self) -> int:
        """``step``, by TRL's (transformers') name."""
        return self.step


#: Keywords every reward call carries besides the data columns (they win over a column of the
#: same name).
CALL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state")


@dataclasses.dataclass(frozen=True, slots=True)
class CallShape:
    """How a reward function is called (:func:`call_shape`).

    Attributes:
      by_keyword: ``prompts`` / ``completions`` as keywords (TRL's convention); False: the
        first two arguments, positionally.
      accepts: the keyword names it takes, or None when it takes ``**kwargs`` (or has no
        signature to read): then every keyword is passed.
    """

    by_keyword: bool
    accepts: frozenset[str] | None

    def wants(self, name: str) -> bool:
        """Whether the call passes keyword ``name``."""
        return self.accepts is None or name in self.accepts


def call_shape(fn: Callable) -> CallShape:
    """How ``fn`` is called: by keyword (TRL's ``def reward_len(completions, **kwargs)``,
    ``def f(completion_ids, **kwargs)``), except a function that names none of
    :data:`CALL_KEYWORDS` and takes two or more positional arguments (``def fn(p, c, **kw)``,
    ``*args``, a builtin), which gets ``(prompts, completions)`` positionally; keywords it
    cannot take are not passed."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the old positional call
        return CallShape(by_keyword=False, accepts=None)
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    named = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_pos = any(p.kind == p.VAR_POSITIONAL for p in params)
    legacy = not named & set(CALL_KEYWORDS) and (len(positional) >= 2 or var_pos)
    return CallShape(by_keyword=not legacy, accepts=None if var_kw else named)


def call_reward(
    fn: Callable, shape: CallShape, prompts: list, completions: list, extra: Mapping[str, Any]
) -> Any:
    """``fn`` called with ``shape``: ``prompts``, ``completions`` and the keywords of ``extra``
    (data columns, ``completion_ids``, ``trainer_state``) that it takes."""
    kw = {k: v for k, v in extra.items() if k not in ("prompts", "completions") and shape.wants(k)}
    if shape.by_keyword:
        if shape.wants("prompts"):
            kw["prompts"] = prompts
        if shape.wants("completions"):
            kw["completions"] = completions
        return fn(**kw)
    return fn(prompts, completions, **kw)


def trl_format(
    prompts: Sequence[str], completions: Sequence[str], sources: Sequence[Any]
) -> tuple[list[Any], list[Any]]:
    """Prompts and completions as TRL passes them to a reward function: a conversational row
    (its source prompt a list of ``{"role", "content"}`` messages) gives that message list and
    ``[{"role": "assistant", "content": completion}]``; a standard row its texts (TRL's
    ``GRPOTrainer`` reward-function contract, https://huggingface.co/docs/trl/grpo_trainer)."""
    if len(sources) != len(completions):
        raise RewardError(
            f"rewards: {len(sources)} source prompts for {len(completions)} completions"
        )
    out_p: list[Any] = []
    out_c: list[Any] = []
    for prompt, completion, source in zip(prompts, completions, sources, strict=True):
        if isinstance(source, (list, tuple)) and all(isinstance(m, Mapping) for m in source):
            out_p.append([dict(m) for m in source])
            out_c.append([{"role": "assistant", "content": completion}])
        else:
            out_p.append(prompt)
            out_c.append(completion)
    return out_p, out_c
