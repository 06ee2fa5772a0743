"""Value-function (critic) loss for PPO, with optional PPO2-style value clipping."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives.aggregation import AggregationMode, aggregate_parts
from jaxrl_llm.ops.masked import masked_mean, safe_divide


def value_loss_parts(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    clip: float | None = None,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`value_loss` as ``(num, den, metrics)`` with ``loss = num / den`` (for accumulation).

    Arguments as :func:`value_loss`.

    Returns:
      ``(num, den, metrics)`` float32 scalars and the metrics of :func:`value_loss`.
    """
    chex.assert_rank([values, old_values, returns, mask], 2)
    chex.assert_equal_shape([values, old_values, returns, mask])
    if clip is not None and clip <= 0:
        raise ConfigError(f"value clip={clip} must be > 0 or None")
    m = mask.astype(bool)
    v = jnp.where(m, values.astype(jnp.float32), 0.0)
    ret = jax.lax.stop_gradient(jnp.where(m, returns.astype(jnp.float32), 0.0))
    err = jnp.square(v - ret)
    metrics: dict[str, jax.Array] = {}
    if clip is None:
        per_token = 0.5 * err
        metrics["vf_clipfrac"] = jnp.zeros((), jnp.float32)
    else:
        old = jax.lax.stop_gradient(jnp.where(m, old_values.astype(jnp.float32), 0.0))
        v_clip = old + jnp.clip(v - old, -clip, clip)
        err_clip = jnp.square(v_clip - ret)
        per_token = 0.5 * jnp.maximum(err, err_clip)
        metrics["vf_clipfrac"] = masked_mean((err_clip > err).astype(jnp.float32), m)
    per_token = jnp.where(m, per_token, 0.0)
    num, den = aggregate_parts(per_token, mask, mode=aggregation, max_len=max_len)
    metrics["value_mean"] = masked_mean(v, m)
    metrics["value_mse"] = masked_mean(err, m)
    metrics = {k: jax.lax.stop_gradient(x) for k, x in metrics.items()}
    return num, den, metrics


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    clip: float | None = None,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Critic loss ``½·(V − R)²``, or with ``clip=c`` ``½·max((V − R)², (V_clip − R)²)``.

    ``V_clip = V_old + clip(V − V_old, −c, c)``: the pessimistic (max) of the clipped and
    unclipped squared errors, as OpenAI baselines PPO2
    (https://github.com/openai/baselines/blob/master/baselines/ppo2/model.py) and verl
    ``compute_value_loss`` / TRL PPO (``cliprange_value`` 0.2) / OpenRLHF ``ValueLoss``.
    The ½ factor follows baselines, verl and TRL. Returns are constants.

    Args:
      values: ``[B, T]`` current value predictions (differentiated).
      old_values: ``[B, T]`` values at sampling time (used only with ``clip``).
      returns: ``[B, T]`` targets R_t (e.g. from :func:`gae`).
      mask: ``[B, T]`` 1 = valid.
      clip: value clip range c, or None (default) for no clipping.
      aggregation: an :class:`~jaxrl_llm.objectives.AggregationMode` or its string.
      max_len: constant length for ``seq_mean_token_sum_norm``.

    Returns:
      ``(loss, metrics)``: scalar float32 loss; metrics ``vf_clipfrac`` (fraction of tokens
      where the clipped error is the larger), ``value_mean``, ``value_mse``.
    """
    num, den, metrics = value_loss_parts(
        values, old_values, returns, mask, clip=clip, aggregation=aggregation, max_len=max_len
    )
    return safe_divide(num, den), metrics
