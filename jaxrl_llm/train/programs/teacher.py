"""The frozen teacher of on-policy distillation, placed on the learner's mesh.

The teacher is a third model beside the policy and its reference: its weights are sharded by
the same rule table as the policy's (``fsdp`` × ``tensor``; :data:`RULES`), and its forwards
run as the reference's do (:func:`~jaxrl_llm.train.programs.builder.forward_under_mesh`): the
rows split over the batch axes, a group's prompt computed once (``logprobs.shared_prompt``).
It is never trained and never checkpointed: a resumed run loads it again from
``teacher.source``. Loading it (sources, tokenizer check) is the online trainer's
(:mod:`jaxrl_llm.train.online.teacher`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm import models
from jaxrl_llm.parallel import logical_to_sharding
from jaxrl_llm.train.programs.policy import RULES


@dataclasses.dataclass
class Teacher:
    """A frozen model on the learner's mesh.

    Attributes:
      config: its model config (compute dtype = ``teacher.dtype``).
      params: its weights, sharded by :data:`~jaxrl_llm.train.programs.policy.RULES` (or
        ``ShapeDtypeStruct``s carrying the shardings, for an abstract teacher).
      sharding: the weights' shardings (the train step's ``frozen_sharding["teacher"]``).
      apply_fn: ``apply_fn(params, input_ids, attention_mask=..., ...)`` -> ModelOutputs.
      tokenizer: its tokenizer (the student's, checked when loaded).
      system_prompt: the privileged context only the teacher sees, or None.
    """

    config: models.ModelConfig
    params: Any
    sharding: Any
    apply_fn: Callable
    tokenizer: Any = None
    system_prompt: str | None = None


def teacher_on_mesh(
    config: models.ModelConfig,
    mesh: jax.sharding.Mesh,
    *,
    params: Any = None,
    dtype: str = "float32",
    tokenizer: Any = None,
    system_prompt: str | None = None,
) -> Teacher:
    """The :class:`Teacher` of ``config`` on ``mesh``: weights in ``dtype`` (float32 or
    bfloat16, also its compute dtype) sharded by the rule table; ``params`` None: abstract
    (shapes and shardings only)."""
    config = dataclasses.replace(config, param_dtype=dtype, compute_dtype=dtype)
    axes = models.param_logical_axes(config)
    shapes = params
    if params is None:
        shapes = jax.eval_shape(
            functools.partial(models.init_params, config), jax.random.PRNGKey(0)
        )
    sharding = logical_to_sharding(axes, mesh, RULES, shapes=shapes)
    if params is None:
        placed = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, jnp.dtype(dtype), sharding=sh),
            shapes,
            sharding,
        )
    else:
        placed = jax.device_put(jax.tree.map(lambda x: jnp.asarray(x, dtype), params), sharding)
    apply_fn = functools.partial(models.apply, config=config)
    if config.is_moe:
        apply_fn = functools.partial(apply_fn, mesh=mesh)
    return Teacher(
        config=config,
        params=placed,
        sharding=sharding,
        apply_fn=apply_fn,
        tokenizer=tokenizer,
        system_prompt=system_prompt,
    )
