"""What the online loop asks of an algorithm family (:class:`Strategy`) and what a family
hands back (:class:`Prepared`, :class:`Companion`). The families are
:mod:`jaxrl_llm.train.online.algorithms` (its ``STRATEGIES`` table) and
:mod:`jaxrl_llm.train.online.distillation`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np

from jaxrl_llm.train.online.experience import Experience
from jaxrl_llm.train.programs.policy import Policy


@dataclasses.dataclass
class Prepared:
    """A strategy's output: the learner batch, the advantages to report, metrics."""

    batch: dict[str, np.ndarray]
    advantages: np.ndarray | None
    metrics: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Companion:
    """A model a strategy trains beside the policy (PPO's critic).

    Attributes:
      name: its checkpoint directory under the run (``critic_checkpoints``).
      policy: its :class:`~jaxrl_llm.train.programs.policy.Policy` (state checkpointed with the
        policy's, at the same steps).
      update: ``update(minibatch) -> metrics``, one update on each of the policy's
        minibatches (the plan's ``companion_fields`` included).
    """

    name: str
    policy: Policy
    update: Callable[[dict], dict]


Reference = Callable[[dict], dict]


class Strategy(Protocol):
    """What the online loop asks of an algorithm family (:mod:`~jaxrl_llm.train.online.algorithms`).

    Built as ``cls(plan, policy, rollouts, log=...)``; ``log`` prints one line.
    """

    def prepare(self, exp: Experience, reference: Reference | None) -> Prepared:
        """The learner batch of ``exp`` (``reference``: the frozen reference's entries of a
        batch, given when the plan needs a reference)."""
        ...

    def companions(self) -> tuple[Companion, ...]:
        """The models trained beside the policy."""
        ...
