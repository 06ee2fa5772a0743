"""Masked reductions and whitening with safe denominators.

Every helper takes an explicit ``mask`` (1 = real element, 0 = padding) of the same shape as
the values, or broadcastable to it. Padding never changes a result: masked elements are
replaced by zero with ``jnp.where`` (not multiplied) so a NaN or Inf at a padded position
cannot leak into the result or its gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_sum(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Σ x·m over ``axis``; masked entries contribute exactly zero (also to gradients)."""
    mask = jnp.broadcast_to(mask, x.shape).astype(bool)
    return jnp.sum(jnp.where(mask, x, 0.0), axis=axis)


def masked_count(mask: jax.Array, axis=None, dtype=jnp.float32) -> jax.Array:
    """Σ m over ``axis`` as a float (the denominator of a masked mean)."""
    return jnp.sum(mask.astype(dtype), axis=axis)


def safe_divide(num: jax.Array, den: jax.Array) -> jax.Array:
    """Num / den, returning 0 where den == 0 (double-``where`` so gradients stay finite)."""
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Σ x·m / Σ m over ``axis``; 0 when the mask is empty (never NaN).

    Example: ``masked_mean(per_token_loss, mask)`` is the token-mean loss of a batch.
    """
    mask = jnp.broadcast_to(mask, x.shape)
    return safe_divide(masked_sum(x, mask, axis), masked_count(mask, axis, x.dtype))


def masked_var(x: jax.Array, mask: jax.Array, axis=None, *, unbiased: bool = True) -> jax.Array:
    """Masked variance; ``unbiased=True`` uses Bessel's correction (n − 1 denominator).

    Returns 0 when fewer than two (unbiased) or one (biased) element is unmasked.
    """
    mask = jnp.broadcast_to(mask, x.shape)
    mean = masked_mean(x, mask, axis)
    if axis is not None:
        mean = jnp.expand_dims(mean, axis)
    sq = masked_sum(jnp.square(x - mean), mask, axis)
    n = masked_count(mask, axis, x.dtype)
    return safe_divide(sq, n - 1.0 if unbiased else n) * (n > (1.0 if unbiased else 0.0))


def masked_std(x: jax.Array, mask: jax.Array, axis=None, *, unbiased: bool = True) -> jax.Array:
    """Square root of :func:`masked_var` (gradient-safe at zero variance)."""
    var = masked_var(x, mask, axis, unbiased=unbiased)
    pos = var > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, var, 1.0)), 0.0)


def masked_whiten(
    x: jax.Array,
    mask: jax.Array,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
    unbiased: bool = True,
) -> jax.Array:
    """(x − mean) / (std + eps) over the unmasked elements; masked entries come back as 0.

    This is the whitening used for PPO/GAE and REINFORCE++ advantages (OpenRLHF and TRL
    whiten with the unbiased variance and ``rsqrt(var + 1e-8)``; we use ``std + eps``, which
    agrees to within eps for non-degenerate batches). With ``shift_mean=False`` the mean is
    added back (TRL's option for returns).
    """
    mask = jnp.broadcast_to(mask, x.shape)
    mean = masked_mean(x, mask)
    std = masked_std(x, mask, unbiased=unbiased)
    out = (x - mean) / (std + eps)
    if not shift_mean:
        out = out + mean
    return jnp.where(mask.astype(bool), out, 0.0)
