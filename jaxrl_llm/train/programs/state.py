"""The train state pytree and its sharded, abstract-first creation.

Shapes come from ``jax.eval_shape``; the state is then materialised by a ``jax.jit`` whose
``out_shardings`` are the rule-table shardings, so every device only ever allocates its own
shards (no full copy on one device first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from jaxrl_llm.parallel.rules import DEFAULT_RULES, MeshAxes, logical_to_sharding, replicated


@flax.struct.dataclass
class TrainState:
    """Everything a train step updates, as one pytree.

    Attributes:
      params: the (master, usually float32) parameter tree.
      opt_state: the optax optimizer state (same dtype as the params).
      step: ``[]`` int32, number of optimizer updates applied.
      rng: ``[2]`` uint32 raw PRNG key, advanced once per step.
    """

    params: Any
    opt_state: Any
    # Any: the same tree also carries shardings or ShapeDtypeStructs (state_sharding_from_params)
    step: Any
    rng: Any


def cast_floats(tree, dtype):
    """``tree`` with every floating-point leaf cast to ``dtype`` (None: unchanged); integer
    leaves keep theirs."""
    if dtype is None:
        return tree
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def state_sharding_from_params(
    optimizer: optax.GradientTransformation, abstract_params: Any, param_sharding: Any, mesh: Mesh
) -> TrainState:
    """Shardings of a whole :class:`TrainState`: optimizer-state leaves that mirror a parameter
    (Adam's μ, ν, …) get that parameter's sharding; other leaves (counts) are replicated.

    Args:
      optimizer: the optax transformation.
      abstract_params: ShapeDtypeStruct tree of the params.
      param_sharding: NamedSharding tree of the params.
      mesh: the mesh.

    Returns:
      A TrainState of NamedShardings.
    """
    rep = replicated(mesh)
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    opt_sharding = optax.tree_map_params(
        optimizer, lambda _, s: s, abstract_opt, param_sharding, transform_non_params=lambda _: rep
    )
    return TrainState(params=param_sharding, opt_state=opt_sharding, step=rep, rng=rep)


def abstract_train_state(
    init_fn: Callable[[jax.Array], Any],
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
    *,
    param_axes: Any,
    param_dtype: Any = jnp.float32,
) -> tuple[TrainState, TrainState]:
    """Shapes and shardings of the train state without allocating anything.

    Args:
      init_fn: ``rng -> params`` (e.g. ``functools.partial(models.init_params, config)``).
      optimizer: optax transformation.
      mesh, rules: where and how to shard (see :mod:`jaxrl_llm.parallel`).
      param_axes: tree of logical-axis tuples matching the params
        (``models.param_logical_axes(config)``).
      param_dtype: master-weight dtype (float32 by default; None keeps ``init_fn``'s dtype).

    Returns:
      ``(abstract_state, state_sharding)``: a TrainState of ``jax.ShapeDtypeStruct`` (each
      carrying its sharding, a ready restore target for checkpoints) and one of NamedShardings.

    Raises:
      ConfigError: a parameter's logical axis has no rule.
    """
    abstract_params = jax.eval_shape(
        lambda r: cast_floats(init_fn(r), param_dtype), jax.random.PRNGKey(0)
    )
    param_sharding = logical_to_sharding(param_axes, mesh, rules, shapes=abstract_params)
    sharding = state_sharding_from_params(optimizer, abstract_params, param_sharding, mesh)

    def build(rng):
        params = cast_floats(init_fn(rng), param_dtype)
        return TrainState(
            params=params, opt_state=optimizer.init(params), step=jnp.zeros((), jnp.int32), rng=rng
        )

    shapes = jax.eval_shape(build, jax.random.PRNGKey(0))
    abstract = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, sharding
    )
    return abstract, sharding


def create_train_state(
    init_fn: Callable[[jax.Array], Any],
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
    *,
    param_axes: Any,
    rng: jax.Array,
    param_dtype: Any = jnp.float32,
) -> tuple[TrainState, TrainState]:
    """Create a sharded :class:`TrainState`, materialised directly in its shards.

    ``init_fn(init_rng)`` and ``optimizer.init`` run inside one ``jax.jit`` with
    ``out_shardings`` from the rule table, so no device holds an unsharded copy.

    Args:
      init_fn: ``rng -> params``.
      optimizer: optax transformation (its state mirrors the params' sharding).
      mesh, rules: the device mesh and logical-axis rule table.
      param_axes: logical-axis tree of the params.
      rng: a raw ``[2]`` uint32 PRNG key; split into the init key and the state's rng.
      param_dtype: master-weight dtype (default float32, mixed-precision training keeps
        f32 master weights and optimizer state); None keeps ``init_fn``'s dtype.

    Returns:
      ``(state, state_sharding)``.
    """
    _, sharding = abstract_train_state(
        init_fn, optimizer, mesh, rules, param_axes=param_axes, param_dtype=param_dtype
    )

    def build(key):
        init_key, state_key = jax.random.split(key)
        params = cast_floats(init_fn(init_key), param_dtype)
        return TrainState(
            params=params,
            opt_state=optimizer.init(params),
            step=jnp.zeros((), jnp.int32),
            rng=state_key,
        )

    rng = jax.device_put(jnp.asarray(rng, jnp.uint32), replicated(mesh))
    return jax.jit(build, out_shardings=sharding)(rng), sharding
