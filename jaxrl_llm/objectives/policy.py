"""Clipped policy-gradient surrogate (PPO / GRPO / DAPO / GSPO family), token or sequence ratio.

Per valid token, with ratio ρ and advantage A::

    ℓ_t = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high))            (PPO, clip-higher)
    ℓ_t = min(ℓ_t, −A·c)        where A < 0, if dual_clip = c      (dual-clip PPO)
    ℓ_t = (π_prox/π_behav)·ℓ_t  with ρ = π_θ/π_prox, if proximal   (decoupled PPO, AReaL)
    ℓ_t = w_t·ℓ_t               if is_weights = w (constants)      (TIS / MIS correction)
    ℓ_t += β·KL_t(π‖π_ref)      if kl_coef = β > 0                 (GRPO's in-loss KL)

then reduced with :func:`jaxrl_llm.objectives.aggregate`. We minimise this loss
(= −objective). References: PPO, Schulman et al. 2017 (https://arxiv.org/abs/1707.06347);
clip-higher, DAPO (https://arxiv.org/abs/2503.14476); dual clip, Ye et al. 2020
(https://arxiv.org/abs/1912.09729); sequence ratio, GSPO (https://arxiv.org/abs/2507.18071);
decoupled PPO, AReaL (https://arxiv.org/abs/2505.24298); importance weights from
:func:`jaxrl_llm.objectives.rollout_correction`. Conventions: the loss form, ``clip_ratio_c``
dual clip, and low/high clip fractions follow verl's ``compute_policy_loss``; TRL and OpenRLHF
compute the same surrogate.
"""

from __future__ import annotations

import enum

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives._util import coerce_enum, masked_min_max
from jaxrl_llm.objectives.aggregation import AggregationMode, aggregate_parts
from jaxrl_llm.objectives.kl import KLKind, kl_penalty
from jaxrl_llm.ops.masked import masked_count, masked_mean, masked_sum, safe_divide


class RatioLevel(str, enum.Enum):
    """Importance ratio per ``"token"`` (PPO/GRPO) or per ``"sequence"`` (GSPO)."""

    TOKEN = "token"
    SEQUENCE = "sequence"


def sequence_log_ratio(logp: jax.Array, old_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO per-token log-ratio: value ``log s_i`` for every token, gradient ``∇ log π(y_t)``.

    ``log s_i = (1/|y_i|) Σ_t (log π(y_t) − log π_old(y_t))`` (GSPO eq. 7, length-normalised
    sequence ratio) and, per token (GSPO-token eq. 13,
    https://arxiv.org/abs/2507.18071), ``log s_{i,t} = sg[log s_i] + log π(y_t) −
    sg[log π(y_t)]``. Its value equals ``log s_i``; its gradient is the token's own
    ``∇ log π(y_t)``, so with a sequence advantage and ``seq_mean_token_mean`` aggregation
    the gradient equals GSPO's.

    Args:
      logp: ``[B, T]`` current log-probs. old_logp: ``[B, T]`` sampling log-probs.
      mask: ``[B, T]`` 1 = valid.

    Returns:
      ``[B, T]`` float32 log-ratios (0 at padding).
    """
    chex.assert_rank([logp, old_logp, mask], 2)
    chex.assert_equal_shape([logp, old_logp, mask])
    m = mask.astype(bool)
    logp = jnp.where(m, logp.astype(jnp.float32), 0.0)
    old = jnp.where(m, old_logp.astype(jnp.float32), 0.0)
    seq = safe_divide(masked_sum(logp - old, m, axis=1), masked_count(m, axis=1))
    lr = jax.lax.stop_gradient(seq)[:, None] + logp - jax.lax.stop_gradient(logp)
    return jnp.where(m, lr, 0.0)


def _clip_range(
    clip_eps: float,
    clip_eps_high: float | None,
    dual_clip: float | None,
    kl_coef: float,
    ref_logp: jax.Array | None,
) -> tuple[float, float]:
    """The checked ``(eps_low, eps_high)`` of :func:`policy_loss_parts`; raises on bad options."""
    eps_low = float(clip_eps)
    eps_high = float(clip_eps if clip_eps_high is None else clip_eps_high)
    if eps_low < 0 or eps_high < 0:
        raise ConfigError(f"clip_eps={clip_eps} and clip_eps_high={clip_eps_high} must be >= 0")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ConfigError(f"dual_clip={dual_clip} must be > 1 (Ye et al. 2020 use 3.0) or None")
    if kl_coef != 0.0 and ref_logp is None:
        raise ConfigError(f"kl_coef={kl_coef} needs ref_logp (the reference log-probs)")
    return eps_low, eps_high


def policy_loss_parts(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    ratio_level: RatioLevel | str = RatioLevel.TOKEN,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
    ref_logp: jax.Array | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind | str = KLKind.K3,
    is_weights: jax.Array | None = None,
    proximal_logp: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`policy_loss` as ``(num, den, metrics)`` with ``loss = num / den``.

    Sum ``num`` and ``den`` over micro-batches (or ``psum`` across devices) and divide once
    to get the exact global loss; ``den`` depends only on the mask (see
    :func:`jaxrl_llm.objectives.aggregation_denominator`). Arguments as :func:`policy_loss`.

    Returns:
      ``(num, den, metrics)``: float32 scalars and the metrics dict of :func:`policy_loss`
      (metrics are token means over this micro-batch).
    """
    chex.assert_rank([logp, old_logp, mask], 2)
    chex.assert_equal_shape([logp, old_logp, mask])
    if advantages.ndim == 1:
        chex.assert_equal(advantages.shape[0], logp.shape[0])
        advantages = jnp.broadcast_to(advantages[:, None], logp.shape)
    else:
        chex.assert_equal_shape([advantages, logp])
    level = coerce_enum(RatioLevel, ratio_level, "ratio_level")
    kl_kind = coerce_enum(KLKind, kl_kind, "kl_kind")
    eps_low, eps_high = _clip_range(clip_eps, clip_eps_high, dual_clip, kl_coef, ref_logp)

    m = mask.astype(bool)
    logp = jnp.where(m, logp.astype(jnp.float32), 0.0)
    old = jax.lax.stop_gradient(jnp.where(m, old_logp.astype(jnp.float32), 0.0))
    adv = jax.lax.stop_gradient(jnp.where(m, advantages.astype(jnp.float32), 0.0))
    metrics: dict[str, jax.Array] = {}
    anchor = old
    if proximal_logp is not None:
        # Decoupled PPO: the ratio and its clip are taken around the proximal policy; the
        # behaviour policy (old_logp) enters only through the constant weight π_prox/π_behav.
        chex.assert_equal_shape([proximal_logp, logp])
        anchor = jax.lax.stop_gradient(jnp.where(m, proximal_logp.astype(jnp.float32), 0.0))
        behav_weight = jnp.where(m, jnp.exp(anchor - old), 0.0)
        metrics["behav_weight_mean"] = masked_mean(behav_weight, m)
        metrics["behav_weight_max"] = masked_min_max(behav_weight, m)[1]
    token_lr = jnp.where(m, logp - anchor, 0.0)
    log_ratio = token_lr if level is RatioLevel.TOKEN else sequence_log_ratio(logp, anchor, mask)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg1 = -adv * ratio
    pg2 = -adv * clipped
    per_token = jnp.maximum(pg1, pg2)
    if dual_clip is not None:
        pg3 = -adv * dual_clip
        dual = jnp.minimum(per_token, pg3)
        active = (adv < 0) & (pg3 < per_token)
        metrics["dual_clipfrac"] = masked_mean(active.astype(jnp.float32), m)
        per_token = jnp.where(adv < 0, dual, per_token)
    if proximal_logp is not None:
        per_token = behav_weight * per_token
    if is_weights is not None:
        chex.assert_equal_shape([is_weights, logp])
        w = jax.lax.stop_gradient(jnp.where(m, is_weights.astype(jnp.float32), 0.0))
        per_token = w * per_token
        metrics["is_weight_mean"] = masked_mean(w, m)
    metrics["pg_loss"] = masked_mean(per_token, m)
    if ref_logp is not None:
        chex.assert_equal_shape([ref_logp, logp])
        ref = jax.lax.stop_gradient(jnp.where(m, ref_logp.astype(jnp.float32), 0.0))
        kl = jnp.where(m, kl_penalty(logp, ref, kind=kl_kind), 0.0)
        metrics["kl"] = masked_mean(kl, m)
        if kl_coef != 0.0:
            per_token = per_token + kl_coef * kl
    per_token = jnp.where(m, per_token, 0.0)
    num, den = aggregate_parts(per_token, mask, mode=aggregation, max_len=max_len)

    low = (ratio < 1.0 - eps_low) & (adv < 0)
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    metrics["clipfrac_low"] = masked_mean(low.astype(jnp.float32), m)
    metrics["clipfrac_high"] = masked_mean(high.astype(jnp.float32), m)
    metrics["clipfrac"] = metrics["clipfrac_low"] + metrics["clipfrac_high"]
    metrics["approx_kl"] = masked_mean(jnp.expm1(token_lr) - token_lr, m)
    metrics["ratio_mean"] = masked_mean(ratio, m)
    metrics["ratio_min"], metrics["ratio_max"] = masked_min_max(ratio, m)
    metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
    return num, den, metrics


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    ratio_level: RatioLevel | str = RatioLevel.TOKEN,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
    ref_logp: jax.Array | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind | str = KLKind.K3,
    is_weights: jax.Array | None = None,
    proximal_logp: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate policy loss (PPO/GRPO/DAPO/GSPO), aggregated to a scalar.

    ``ρ_t = exp(log π(y_t) − log π_old(y_t))`` (``ratio_level="token"``) or GSPO's
    ``s_i = exp((1/|y_i|) Σ_t log-ratio)`` with the per-token stop-gradient form
    (``"sequence"``, see :func:`sequence_log_ratio`). Per token
    ``ℓ = max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high))``; with ``dual_clip=c``,
    ``ℓ = min(ℓ, −c·A)`` for A < 0; plus ``kl_coef·KL_t`` when ``kl_coef > 0``. We minimise
    ℓ (= −objective). Optional constant per-token weights: ``ℓ ← w_t·ℓ`` (``is_weights``,
    off-policy correction); decoupled PPO (``proximal_logp``): ``ρ_t = π_θ/π_prox`` and
    ``ℓ ← (π_prox/π_behav)·ℓ`` with the behaviour policy ``old_logp`` (AReaL,
    https://arxiv.org/abs/2505.24298). PPO https://arxiv.org/abs/1707.06347 (ε = 0.2);
    DAPO clip-higher https://arxiv.org/abs/2503.14476 (ε_low 0.2, ε_high 0.28); dual clip
    https://arxiv.org/abs/1912.09729 (c = 3); GSPO https://arxiv.org/abs/2507.18071
    (ε ≈ 3e-4 / 4e-4); GRPO's in-loss k3 KL https://arxiv.org/abs/2402.03300.
    With ρ = 1 and no clipping active the gradient is the vanilla policy gradient
    ``−A·∇log π``.

    Args:
      logp: ``[B, T]`` log π_θ(y_t) (differentiated).
      old_logp: ``[B, T]`` log π_old(y_t) of the sampling policy (constant).
      advantages: ``[B]`` (broadcast over tokens) or ``[B, T]`` (constant).
      mask: ``[B, T]`` 1 = valid response token.
      clip_eps: ε_low (default 0.2, PPO).
      clip_eps_high: ε_high; None means ε_high = ε_low.
      dual_clip: c > 1 for dual-clip PPO, or None.
      ratio_level: a :class:`RatioLevel` or ``"token"`` / ``"sequence"``.
      aggregation: an :class:`~jaxrl_llm.objectives.AggregationMode` or its string.
      max_len: constant length for ``seq_mean_token_sum_norm``.
      ref_logp: ``[B, T]`` reference log-probs, for the KL term and the ``kl`` metric.
      kl_coef: β of the in-loss KL (default 0.0; GRPO used 0.04).
      kl_kind: KL estimator (default ``"k3"``, GRPO).
      is_weights: ``[B, T]`` constant importance weights multiplying the per-token surrogate
        (not the KL term), e.g. from :func:`~jaxrl_llm.objectives.rollout_correction`
        (TIS / MIS); a zero weight keeps the token in the denominator. None: no weights.
      proximal_logp: ``[B, T]`` log π_prox of the proximal policy for decoupled PPO
        (AReaL, https://arxiv.org/abs/2505.24298): ``old_logp`` is then the behaviour
        policy that sampled, the ratio and its clip are ``π_θ/π_prox``, and the surrogate is
        multiplied by the constant ``π_prox/π_behav``. With ``proximal_logp == old_logp``
        this is plain PPO. None (default): the ratio is taken against ``old_logp``.

    Returns:
      ``(loss, metrics)``: scalar float32 loss and a dict of scalar metrics (token means
      over valid tokens, no gradient): ``pg_loss``, ``clipfrac``, ``clipfrac_low``,
      ``clipfrac_high``, ``approx_kl`` (k3 estimate of KL(π_old‖π_θ)), ``ratio_mean``,
      ``ratio_min``, ``ratio_max``, plus ``kl`` when ``ref_logp`` is given,
      ``dual_clipfrac`` when ``dual_clip`` is set, ``is_weight_mean`` with ``is_weights``,
      and ``behav_weight_mean`` / ``behav_weight_max`` with ``proximal_logp`` (then the
      ratio metrics and ``approx_kl`` are against π_prox).
    """
    num, den, metrics = policy_loss_parts(
        logp,
        old_logp,
        advantages,
        mask,
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        ratio_level=ratio_level,
        aggregation=aggregation,
        max_len=max_len,
        ref_logp=ref_logp,
        kl_coef=kl_coef,
        kl_kind=kl_kind,
        is_weights=is_weights,
        proximal_logp=proximal_logp,
    )
    return safe_divide(num, den), metrics
