"""The one role vocabulary (issue 51): the models and programs of a run, as the placement
(:mod:`jaxrl_llm.parallel.placement`: where each lives) and the memory estimate
(:mod:`jaxrl_llm.train.compile.memory_rows`: which models a step holds) both name them."""

from __future__ import annotations

import enum


class Role(str, enum.Enum):
    """A model or program of a run. ``LEARNER`` is the trained model (its weights, gradients and
    optimizer state); ``SAMPLER`` its rollout copy; ``REFERENCE``, ``TEACHER``, ``CRITIC`` and
    ``REWARD`` the other models an algorithm may hold. A ``str``: ``Role.SAMPLER == "sampler"``."""

    LEARNER = "learner"
    SAMPLER = "sampler"
    REFERENCE = "reference"
    TEACHER = "teacher"
    CRITIC = "critic"
    REWARD = "reward"


#: The roles a :class:`~jaxrl_llm.parallel.placement.Placement` places (the reward model is
#: scored where the learner lives).
PLACED_ROLES: tuple[Role, ...] = (
    Role.LEARNER,
    Role.SAMPLER,
    Role.REFERENCE,
    Role.TEACHER,
    Role.CRITIC,
)
