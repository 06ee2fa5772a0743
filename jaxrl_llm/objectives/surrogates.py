"""Policy surrogates of 2024–25: CISPO, SAPO, GMPO and DRO, beside the clipped PPO loss of ``policy.py``.

With the token log-ratio ``log r_t = log π_θ(y_t) − log π_old(y_t)`` and advantage ``A``
(we minimise loss = −objective):

* CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585):
  ``ℓ_t = −sg(clip(r_t, 1 − ε_low, 1 + ε_high))·A·log π_θ(y_t)``. The importance weight is
  clipped, not the update: every token keeps its gradient ``−ŵ_t·A·∇log π``.
* SAPO (Qwen team, https://arxiv.org/abs/2511.20347):
  ``ℓ_t = −(4/τ)·σ(τ(r_t − 1))·A`` with ``τ = τ_pos`` for A > 0 and ``τ_neg`` otherwise, a
  smooth gate in place of a hard clip. Its gradient is ``−4σ(1−σ)·r_t·A·∇log π``, i.e. the
  vanilla policy gradient at r = 1, fading smoothly as r leaves 1.
* GMPO (https://arxiv.org/abs/2507.20673): one term per sequence,
  ``ℓ_i = −A_i·exp((1/|y_i|) Σ_t clip_A(log r_t))``, the geometric mean of token ratios,
  with each log-ratio clipped to ``[−ε, ε]`` on the side the sign of A makes active.
* DRO (Richemond et al. 2024, https://arxiv.org/abs/2405.19107; Kimi k1.5,
  https://arxiv.org/abs/2501.12599): ``ℓ_t = −(A·log π_θ(y_t) − (β/2)·(log r_t)²)``, a plain
  policy gradient held near the sampler by a quadratic penalty instead of a clip; works on
  off-policy and offline data.

Each has a ``*_parts`` form returning ``(num, den, metrics)``: sum ``num`` and ``den`` over
micro-batches (or ``psum`` over devices) and divide once for the exact global loss.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives._util import masked_min_max, token_advantages
from jaxrl_llm.objectives.aggregation import AggregationMode, aggregate_parts
from jaxrl_llm.ops.masked import masked_count, masked_mean, masked_sum, safe_divide

# exp() of a log-ratio beyond this bound is clamped (as verl does); σ(τ(r − 1)) and every
# gate derivative are saturated long before it.
_MAX_LOG_RATIO = 20.0


def _inputs(logp, old_logp, advantages, mask):
    """Masked float32 ``(m, logp, old, adv)``; old and adv are constants; shapes checked."""
    chex.assert_rank([logp, old_logp, mask], 2)
    chex.assert_equal_shape([logp, old_logp, mask])
    advantages = token_advantages(advantages, logp.shape)
    m = mask.astype(bool)
    logp = jnp.where(m, logp.astype(jnp.float32), 0.0)
    old = jax.lax.stop_gradient(jnp.where(m, old_logp.astype(jnp.float32), 0.0))
    adv = jax.lax.stop_gradient(jnp.where(m, advantages.astype(jnp.float32), 0.0))
    return m, logp, old, adv


def _ratio_metrics(log_ratio, m) -> dict[str, jax.Array]:
    """``approx_kl`` (k3 of KL(π_old‖π_θ)), ``ratio_mean``, ``ratio_min``, ``ratio_max``."""
    lr = jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = jnp.exp(lr)
    out = {"approx_kl": masked_mean(jnp.expm1(lr) - lr, m), "ratio_mean": masked_mean(ratio, m)}
    out["ratio_min"], out["ratio_max"] = masked_min_max(ratio, m)
    return out


def _weighted(per_token, is_weights, m):
    """``w·ℓ`` with constant rollout-correction weights ``w`` (None: unchanged) and the
    ``rollout_weight_mean`` metric; a zero weight keeps its token in the denominator."""
    if is_weights is None:
        return per_token, {}
    chex.assert_equal_shape([is_weights, per_token])
    w = jax.lax.stop_gradient(jnp.where(m, is_weights.astype(jnp.float32), 0.0))
    return w * per_token, {"rollout_weight_mean": masked_mean(w, m)}


def cispo_loss_parts(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps_low: float | None = 0.2,
    clip_eps_high: float | None = 0.2,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
    is_weights: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`cispo_loss` as ``(num, den, metrics)`` with ``loss = num / den``.

    Sum ``num`` and ``den`` over micro-batches and divide once for the exact global loss
    (``den`` depends only on the mask). Arguments and metrics as :func:`cispo_loss`.
    """
    for name, eps in (("clip_eps_low", clip_eps_low), ("clip_eps_high", clip_eps_high)):
        if eps is not None and eps < 0:
            raise ConfigError(f"{name}={eps} must be >= 0 or None (no bound)")
    m, logp, old, adv = _inputs(logp, old_logp, advantages, mask)
    log_ratio = jnp.where(m, logp - old, 0.0)
    ratio = jax.lax.stop_gradient(jnp.exp(jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)))
    low = None if clip_eps_low is None else 1.0 - float(clip_eps_low)
    high = None if clip_eps_high is None else 1.0 + float(clip_eps_high)
    weight = jnp.clip(ratio, low, high) if (low, high) != (None, None) else ratio
    per_token = jnp.where(m, -weight * adv * logp, 0.0)
    per_token, w_metrics = _weighted(per_token, is_weights, m)
    num, den = aggregate_parts(per_token, mask, mode=aggregation, max_len=max_len)

    below = ratio < low if low is not None else jnp.zeros_like(m)
    above = ratio > high if high is not None else jnp.zeros_like(m)
    metrics = {
        "clipfrac_low": masked_mean(below.astype(jnp.float32), m),
        "clipfrac_high": masked_mean(above.astype(jnp.float32), m),
        "is_weight_mean": masked_mean(weight, m),
        **_ratio_metrics(log_ratio, m),
        **w_metrics,
    }
    metrics["clipfrac"] = metrics["clipfrac_low"] + metrics["clipfrac_high"]
    return num, den, {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}


def cispo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps_low: float | None = 0.2,
    clip_eps_high: float | None = 0.2,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
    is_weights: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """CISPO: policy gradient with a clipped, stop-gradient importance weight per token.

    ``ℓ_t = −sg(clip(r_t, 1 − ε_low, 1 + ε_high))·A_t·log π_θ(y_t)``, aggregated with
    ``aggregation`` (the paper uses the token mean). MiniMax-M1,
    https://arxiv.org/abs/2506.13585. Unlike PPO's clip, which zeroes the gradient
    of a clipped token, the weight here is a constant and every token keeps its gradient
    ``−ŵ_t·A_t·∇log π_θ(y_t)``; with ``r = 1`` this is the vanilla policy gradient. The loss
    *value* is ``−ŵ·A·log π`` (a gradient carrier, not the PPO surrogate's value). The paper
    imposes no lower bound (``clip_eps_low=None``) and tunes ε_high; the defaults (0.2, 0.2)
    follow verl's ``cispo`` loss (its PPO clip ratios).

    Args:
      logp: ``[B, T]`` log π_θ(y_t) (differentiated).
      old_logp: ``[B, T]`` log π_old(y_t) of the sampling policy (constant).
      advantages: ``[B]`` (broadcast over tokens) or ``[B, T]`` (constant).
      mask: ``[B, T]`` 1 = valid response token.
      clip_eps_low: ε_low ≥ 0, or None for no lower bound on the weight (the paper's setting).
      clip_eps_high: ε_high ≥ 0, or None for no upper bound.
      aggregation: an :class:`~jaxrl_llm.objectives.AggregationMode` or its string.
      max_len: constant length for ``seq_mean_token_sum_norm``.
      is_weights: ``[B, T]`` constant weights multiplying each token's loss (rollout
        correction, TIS / MIS: :func:`~jaxrl_llm.objectives.rollout_correction`; metric
        ``rollout_weight_mean``), or None.

    Returns:
      ``(loss, metrics)``: scalar float32 loss (minimised) and scalar metrics (token means over
      valid tokens, no gradient): ``clipfrac`` (share of clipped weights), ``clipfrac_low``,
      ``clipfrac_high``, ``is_weight_mean`` (mean clipped weight), ``approx_kl``,
      ``ratio_mean``, ``ratio_min``, ``ratio_max``.
    """
    num, den, metrics = cispo_loss_parts(
        logp,
        old_logp,
        advantages,
        mask,
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        aggregation=aggregation,
        max_len=max_len,
        is_weights=is_weights,
    )
    return safe_divide(num, den), metrics


def sapo_loss_parts(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    aggregation: AggregationMode | str = AggregationMode.SEQ_MEAN_TOKEN_MEAN,
    max_len: int | None = None,
    is_weights: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`sapo_loss` as ``(num, den, metrics)`` with ``loss = num / den``.

    Sum ``num`` and ``den`` over micro-batches and divide once for the exact global loss.
    Arguments and metrics as :func:`sapo_loss`.
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ConfigError(f"tau_pos={tau_pos} and tau_neg={tau_neg} must be > 0")
    m, logp, old, adv = _inputs(logp, old_logp, advantages, mask)
    log_ratio = jnp.where(m, logp - old, 0.0)
    ratio = jnp.exp(jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    tau = jnp.where(adv > 0, float(tau_pos), float(tau_neg))
    gate = jax.nn.sigmoid(tau * (ratio - 1.0))
    per_token = jnp.where(m, -(4.0 / tau) * gate * adv, 0.0)
    per_token, w_metrics = _weighted(per_token, is_weights, m)
    num, den = aggregate_parts(per_token, mask, mode=aggregation, max_len=max_len)
    # d gate-term / d log π = 4σ(1−σ)·r: the factor that multiplies −A·∇log π.
    grad_weight = 4.0 * gate * (1.0 - gate) * ratio
    metrics = {
        "pg_loss": masked_mean(per_token, m),
        "gate_weight_mean": masked_mean(grad_weight, m),
        "gate_weight_min": masked_min_max(grad_weight, m)[0],
        **_ratio_metrics(log_ratio, m),
        **w_metrics,
    }
    return num, den, {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}


def sapo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    aggregation: AggregationMode | str = AggregationMode.SEQ_MEAN_TOKEN_MEAN,
    max_len: int | None = None,
    is_weights: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """SAPO: a temperature-controlled sigmoid gate on the token ratio instead of a hard clip.

    ``ℓ_t = −(4/τ_t)·σ(τ_t·(r_t − 1))·A_t`` with ``τ_t = τ_pos`` where ``A_t > 0`` and
    ``τ_neg`` otherwise (Soft Adaptive Policy Optimization, Qwen team 2025,
    https://arxiv.org/abs/2511.20347; defaults τ_pos = 1.0, τ_neg = 1.05: the paper
    argues for τ_neg > τ_pos, a faster decay for negative advantages). The gradient is
    ``−w_t·r_t·A_t·∇log π_θ(y_t)`` with the soft gate ``w_t = 4σ(1 − σ)``, which is 1 at
    ``r = 1`` (the vanilla policy gradient on-policy) and decays smoothly as ``r`` leaves 1.
    The paper averages tokens within a sequence, then sequences (``seq_mean_token_mean``).

    Args:
      logp: ``[B, T]`` log π_θ(y_t) (differentiated).
      old_logp: ``[B, T]`` log π_old(y_t) (constant).
      advantages: ``[B]`` or ``[B, T]`` (constant).
      mask: ``[B, T]`` 1 = valid response token.
      tau_pos: τ for tokens with a positive advantage (> 0).
      tau_neg: τ for the others (> 0).
      aggregation: an :class:`~jaxrl_llm.objectives.AggregationMode` or its string.
      max_len: constant length for ``seq_mean_token_sum_norm``.
      is_weights: ``[B, T]`` constant weights multiplying each token's loss (rollout
        correction, TIS / MIS: :func:`~jaxrl_llm.objectives.rollout_correction`; metric
        ``rollout_weight_mean``), or None.

    Returns:
      ``(loss, metrics)``: scalar float32 loss and scalar metrics (token means, no gradient):
      ``pg_loss``, ``gate_weight_mean`` and ``gate_weight_min`` (the factor ``w_t·r_t`` of
      the gradient), ``approx_kl``, ``ratio_mean``, ``ratio_min``, ``ratio_max``.
    """
    num, den, metrics = sapo_loss_parts(
        logp,
        old_logp,
        advantages,
        mask,
        tau_pos=tau_pos,
        tau_neg=tau_neg,
        aggregation=aggregation,
        max_len=max_len,
        is_weights=is_weights,
    )
    return safe_divide(num, den), metrics


def gmpo_loss_parts(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.4,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`gmpo_loss` as ``(num, den, metrics)``: Σ over sequences and the count B'.

    ``den`` is the number of rows with at least one valid token, so summing both over
    micro-batches and dividing once gives the mean over every sequence of the batch.
    Arguments and metrics as :func:`gmpo_loss`.
    """
    if clip_eps < 0:
        raise ConfigError(f"clip_eps={clip_eps} must be >= 0 (GMPO uses 0.4)")
    m, logp, old, adv = _inputs(logp, old_logp, advantages, mask)
    n = masked_count(m, axis=1)
    seq_adv = safe_divide(masked_sum(adv, m, axis=1), n)
    sign = jnp.sign(seq_adv)[:, None]
    log_ratio = jnp.where(m, logp - old, 0.0)
    clipped = jnp.clip(log_ratio, -clip_eps, clip_eps)
    # sign·min(sign·x, sign·clip(x)): A > 0 caps the log-ratio at +ε, A < 0 floors it at −ε.
    lr = sign * jnp.minimum(sign * log_ratio, sign * clipped)
    seq_lr = safe_divide(masked_sum(lr, m, axis=1), n)
    seq_ratio = jnp.exp(jnp.clip(seq_lr, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    has_tokens = n > 0
    seq_loss = jnp.where(has_tokens, -seq_adv * seq_ratio, 0.0)
    num = jnp.sum(seq_loss)
    den = jnp.sum(has_tokens.astype(jnp.float32))

    active = (lr != log_ratio) & m
    rows = has_tokens.astype(jnp.float32)
    metrics = {
        "clipfrac": masked_mean(active.astype(jnp.float32), m),
        "clipfrac_high": masked_mean((active & (sign > 0)).astype(jnp.float32), m),
        "clipfrac_low": masked_mean((active & (sign < 0)).astype(jnp.float32), m),
        "seq_ratio_mean": masked_mean(seq_ratio, rows),
        **_ratio_metrics(log_ratio, m),
    }
    return num, den, {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}


def gmpo_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.4,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GMPO: the geometric mean of token ratios per sequence, clipped token-wise in log space.

    ``ℓ_i = −A_i·exp((1/|y_i|) Σ_t sgn(A_i)·min(sgn(A_i)·log r_t,
    sgn(A_i)·clip(log r_t, −ε, ε)))``, averaged over sequences (Geometric-Mean Policy
    Optimization, 2025, https://arxiv.org/abs/2507.20673; ε = 0.4, i.e.
    the ratio range (e^{−0.4}, e^{0.4})). For A > 0 only a token's upward log-ratio is capped,
    for A < 0 only its downward one, as PPO's min does; a capped token loses its gradient
    while the others keep theirs (scaled by the sequence's geometric-mean ratio / |y_i|).
    Rows without a valid token are not counted.

    Args:
      logp: ``[B, T]`` log π_θ(y_t) (differentiated).
      old_logp: ``[B, T]`` log π_old(y_t) (constant).
      advantages: ``[B]`` sequence advantages, or ``[B, T]`` token advantages, whose mean over
        the row's valid tokens is used (GMPO defines one advantage per sequence).
      mask: ``[B, T]`` 1 = valid response token.
      clip_eps: ε ≥ 0, the log-ratio clip (default 0.4, the paper's).

    Returns:
      ``(loss, metrics)``: scalar float32 loss and scalar metrics (no gradient): ``clipfrac``,
      ``clipfrac_high`` (capped tokens of A > 0 rows), ``clipfrac_low`` (A < 0), token means;
      ``seq_ratio_mean`` (mean geometric-mean ratio over rows), ``approx_kl``, ``ratio_mean``,
      ``ratio_min``, ``ratio_max``.
    """
    num, den, metrics = gmpo_loss_parts(logp, old_logp, advantages, mask, clip_eps=clip_eps)
    return safe_divide(num, den), metrics


def dro_loss_parts(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    beta: float = 0.1,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`dro_loss` as ``(num, den, metrics)`` with ``loss = num / den``; with the default
    ``token_mean``, ``num`` is the sum over tokens (Tinker's ``dro`` loss)."""
    if beta < 0:
        raise ConfigError(f"beta={beta} must be >= 0 (the quadratic penalty's weight)")
    m, logp, old, adv = _inputs(logp, old_logp, advantages, mask)
    log_ratio = jnp.where(m, logp - old, 0.0)
    per_token = jnp.where(m, -(adv * logp - 0.5 * float(beta) * jnp.square(log_ratio)), 0.0)
    num, den = aggregate_parts(per_token, mask, mode=aggregation, max_len=max_len)
    metrics = {
        "penalty_mean": masked_mean(jnp.square(log_ratio), m),
        **_ratio_metrics(log_ratio, m),
    }
    return num, den, {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}


def dro_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    beta: float = 0.1,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DRO: a policy gradient with a quadratic penalty on the log-ratio to the sampler.

    ``ℓ_t = −(A_t·log π_θ(y_t) − (β/2)·(log π_θ(y_t) − log q(y_t))²)`` (Direct Reward
    Optimisation, Richemond et al. 2024, https://arxiv.org/abs/2405.19107, as the policy loss
    of Kimi k1.5, https://arxiv.org/abs/2501.12599, and Tinker's ``dro``,
    https://tinker-docs.thinkingmachines.ai/tinker/losses/dro). The advantage is the
    client's (DRO's soft value baseline is computed outside the loss). Gradient per token:
    ``−(A_t − β·log r_t)·∇log π``: the penalty pulls back any token whose log-ratio has
    drifted, with no clip and no dead zone.

    Args:
      logp: ``[B, T]`` log π_θ(y_t) (differentiated).
      old_logp: ``[B, T]`` log q(y_t), the sampler's (constant).
      advantages: ``[B]`` or ``[B, T]``.
      mask: ``[B, T]`` 1 = valid response token.
      beta: β ≥ 0, the penalty's weight (Tinker's ``loss_fn_config["beta"]``).
      aggregation, max_len: as :func:`jaxrl_llm.objectives.aggregate`.

    Returns:
      ``(loss, metrics)``: ``penalty_mean`` (mean squared log-ratio), ``approx_kl``,
      ``ratio_mean``, ``ratio_min``, ``ratio_max``.
    """
    num, den, metrics = dro_loss_parts(
        logp, old_logp, advantages, mask, beta=beta, aggregation=aggregation, max_len=max_len
    )
    return safe_divide(num, den), metrics
