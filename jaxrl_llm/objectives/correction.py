"""Importance weights for the mismatch between the inference engine and the learner.

The engine that samples (a paged-KV decoder, often in another precision or with other
kernels) gives log-probs ``log μ(y_t)`` that differ from the learner's recomputation
``log π(y_t)`` of the same policy. Off-policy correction reweights each token (or sequence)
by ``π/μ``, bounded to keep the variance finite (Yao et al. 2025, "Your Efficient RL
Framework Secretly Brings You Off-Policy RL Training",
https://fengyao.notion.site/off-policy-rl):

* ``level="token"``: ``w_t = π(y_t)/μ(y_t)``; ``level="sequence"``:
  ``w_t = exp(Σ_s (log π(y_s) − log μ(y_s)))`` for every token of the row.
* ``mode="truncate"`` (TIS): ``w ← clip(w, low, high)``; ``mode="mask"`` (MIS, and IcePop of
  the Ling team's Ring-1T report, 2025): ``w ← 0`` where ``w ∉ [low, high]``.

The weights are constants (no gradient). Multiply the per-token surrogate by them
(``policy_loss(..., is_weights=w)``): a masked token keeps its place in the aggregation's
denominator (its mask stays 1; only its weight is 0), as in verl's ``rollout_is`` and the
TIS recipe. Log-ratios are clamped to ±20 before ``exp`` (as verl does) so weights and
metrics stay finite.
"""

from __future__ import annotations

import enum
import math

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives._util import coerce_enum, masked_min_max
from jaxrl_llm.ops.masked import masked_mean, masked_sum

_MAX_LOG_RATIO = 20.0


class CorrectionLevel(str, enum.Enum):
    """Importance weight per ``"token"`` or one per ``"sequence"`` (broadcast over its row)."""

    TOKEN = "token"
    SEQUENCE = "sequence"


class CorrectionMode(str, enum.Enum):
    """``"truncate"`` weights to [low, high] (TIS) or ``"mask"`` those outside (MIS/IcePop)."""

    TRUNCATE = "truncate"
    MASK = "mask"


def rollout_correction(
    logp: jax.Array,
    rollout_logp: jax.Array,
    mask: jax.Array,
    *,
    level: CorrectionLevel | str = CorrectionLevel.TOKEN,
    mode: CorrectionMode | str = CorrectionMode.TRUNCATE,
    low: float | None = None,
    high: float | None = 2.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Bounded importance weights ``π/μ`` between the learner (π) and the sampling engine (μ).

    ``d_t = log π(y_t) − log μ(y_t)``; ``ρ = exp(d_t)`` (token) or ``exp(Σ_t d_t)`` broadcast
    over the row (sequence). ``truncate``: ``w = clip(ρ, low, high)`` (truncated importance
    sampling, Yao et al. 2025, https://fengyao.notion.site/off-policy-rl; cap 2 is their
    default); ``mask``: ``w = ρ·1[low ≤ ρ ≤ high]`` (masked importance sampling / IcePop).
    ``None`` leaves that side unbounded.

    Example::

        w, m = rollout_correction(old_logp, engine_logp, mask, mode="mask", low=0.5, high=2.0)
        loss, metrics = policy_loss(logp, old_logp, adv, mask, is_weights=w)

    Args:
      logp: ``[B, T]`` the learner's log-probs of the sampled tokens (treated as constant).
      rollout_logp: ``[B, T]`` the engine's log-probs of the same tokens.
      mask: ``[B, T]`` 1 = valid response token.
      level: a :class:`CorrectionLevel` or ``"token"`` / ``"sequence"``.
      mode: a :class:`CorrectionMode` or ``"truncate"`` / ``"mask"``.
      low: lower bound ≥ 0, or None (default: none, as TIS).
      high: upper bound > 0, or None (default 2.0).

    Returns:
      ``(weights, metrics)``: ``weights`` ``[B, T]`` float32, 0 at padding, no gradient;
      scalar metrics (token means over valid tokens): ``weight_mean``, ``weight_max`` (after
      the bounds), ``ratio_max`` (before), ``outside_frac`` (share of tokens whose ρ is outside
      [low, high]), ``mismatch_kl`` (k3 estimate of KL(μ‖π) from μ's samples,
      ``mean(e^d − 1 − d)``), and ``seq_outside_frac`` (share of rows) at sequence level.
    """
    chex.assert_rank([logp, rollout_logp, mask], 2)
    chex.assert_equal_shape([logp, rollout_logp, mask])
    level = coerce_enum(CorrectionLevel, level, "level")
    mode = coerce_enum(CorrectionMode, mode, "mode")
    if low is not None and low < 0:
        raise ConfigError(f"rollout correction low={low} must be >= 0 or None")
    if high is not None and high <= 0:
        raise ConfigError(f"rollout correction high={high} must be > 0 or None")
    if low is not None and high is not None and low > high:
        raise ConfigError(f"rollout correction low={low} must be <= high={high}")

    m = mask.astype(bool)
    lp = jax.lax.stop_gradient(jnp.where(m, logp.astype(jnp.float32), 0.0))
    rl = jax.lax.stop_gradient(jnp.where(m, rollout_logp.astype(jnp.float32), 0.0))
    token_d = jnp.clip(jnp.where(m, lp - rl, 0.0), -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    if level is CorrectionLevel.TOKEN:
        log_ratio = token_d
    else:
        row = jnp.clip(masked_sum(lp - rl, m, axis=1), -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        log_ratio = jnp.broadcast_to(row[:, None], lp.shape)
    ratio = jnp.exp(log_ratio)
    # Compare in log space so that a bound is exact even where exp would round.
    below = log_ratio < math.log(low) if low else jnp.zeros_like(m)
    above = log_ratio > math.log(high) if high is not None else jnp.zeros_like(m)
    outside = (below | above) & m
    if mode is CorrectionMode.TRUNCATE:
        weights = jnp.clip(ratio, low, high) if (low, high) != (None, None) else ratio
    else:
        weights = jnp.where(outside, 0.0, ratio)
    weights = jnp.where(m, weights, 0.0)

    metrics = {
        "weight_mean": masked_mean(weights, m),
        "weight_max": masked_min_max(weights, m)[1],
        "ratio_max": masked_min_max(ratio, m)[1],
        "outside_frac": masked_mean(outside.astype(jnp.float32), m),
        "mismatch_kl": masked_mean(jnp.expm1(token_d) - token_d, m),
    }
    if level is CorrectionLevel.SEQUENCE:
        rows = jnp.any(m, axis=1)
        metrics["seq_outside_frac"] = masked_mean(
            jnp.any(outside, axis=1).astype(jnp.float32), rows
        )
    return jax.lax.stop_gradient(weights), jax.lax.stop_gradient(metrics)
