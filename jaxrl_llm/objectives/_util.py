"""Private helpers shared by the objectives modules (enum coercion, group checks)."""

from __future__ import annotations

import enum
from typing import TypeVar

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError

E = TypeVar("E", bound=enum.Enum)


def coerce_enum(cls: type[E], value, name: str) -> E:
    """Return ``cls(value)``; raise ConfigError naming ``name`` and the allowed values."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise ConfigError(f"{name}={value!r} is not supported; use one of {allowed}") from None


def check_group_size(n: int, group_size: int, name: str = "rewards") -> int:
    """Validate that ``n`` rows split into whole groups of ``group_size``; return #groups."""
    if not isinstance(group_size, int) or group_size < 1:
        raise ConfigError(f"group_size={group_size!r} must be a positive integer")
    if n % group_size:
        raise ConfigError(
            f"{name} has {n} rows, not a multiple of group_size={group_size}; "
            "groups are consecutive rows of group_size"
        )
    return n // group_size


def safe_rsqrt(x: jax.Array) -> jax.Array:
    """1/sqrt(x) where x > 0, else 0 (double-where)."""
    ok = x > 0
    return jnp.where(ok, jax.lax.rsqrt(jnp.where(ok, x, 1.0)), 0.0)


def masked_min_max(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Min and max of x over mask; both 0 when the mask is empty."""
    m = jnp.broadcast_to(mask, x.shape).astype(bool)
    any_ = jnp.any(m)
    lo = jnp.min(jnp.where(m, x, jnp.inf))
    hi = jnp.max(jnp.where(m, x, -jnp.inf))
    return jnp.where(any_, lo, 0.0), jnp.where(any_, hi, 0.0)


def token_advantages(advantages: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``[B]`` advantages broadcast over tokens to ``shape`` ``[B, T]``; ``[B, T]`` checked."""
    if advantages.ndim == 1:
        chex.assert_equal(advantages.shape[0], shape[0])
        return jnp.broadcast_to(advantages[:, None], shape)
    chex.assert_shape(advantages, shape)
    return advantages
