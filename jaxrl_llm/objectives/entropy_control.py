"""Entropy control by the covariance of log-prob and advantage: KL-Cov and Clip-Cov.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models" (https://arxiv.org/abs/2505.22617), show that the policy's entropy falls in proportion
to the covariance between a token's log-prob and its advantage, and that a small share of
tokens with a very large covariance drive the collapse. For the N valid tokens of the batch
(flattened over ``[B, T]``), each token's centred product is

    Cov_t = (log π_θ(y_t) − (1/N) Σ_j log π_θ(y_j)) · (A_t − (1/N) Σ_j A_j)

(its mean over the tokens is the batch covariance). Both methods keep the policy gradient of
PPO but act on a few tokens picked by ``Cov_t`` (a constant: no gradient flows through it):

* **KL-Cov**: the ``k = max(1, ⌊kl_cov_ratio·N⌋)`` tokens with the largest ``Cov_t`` get a
  KL penalty ``kl_coef·|log π_θ(y_t) − log π_old(y_t)|``; the others the plain surrogate
  ``−A·r`` (no ratio clip, as in the paper).
* **Clip-Cov**: among the tokens not already clipped by PPO whose ``Cov_t`` lies strictly in
  ``(clip_cov_lb, clip_cov_ub)``, ``min(count, max(1, ⌊clip_cov_ratio·N⌋))`` are drawn uniformly
  at random (PRNG ``key``) and their gradient is detached; the rest get PPO's clipped
  surrogate.

Conventions, and where implementations differ:

* N, the means and the selection are those of the arrays passed in, i.e. of one call. verl
  (``compute_policy_loss_kl_cov`` / ``_clip_cov``, adapted from the authors' PRIME-RL code,
  which most other frameworks copy) calls the loss per micro-batch, so its selection is per
  micro-batch too; the paper states it over the batch. Pass the whole batch to get the
  paper's selection; the ``*_parts`` forms still accumulate exactly for a given selection.
* Ties in ``Cov_t`` (KL-Cov) go to the earlier token in row-major order (``lax.top_k``);
  ``torch.topk`` leaves them unspecified.
* Clip-Cov: verl multiplies the selected tokens' loss by 0 (value and gradient 0); we
  detach them with ``stop_gradient`` (value kept, gradient 0). Gradients are identical; our
  reported loss is still the PPO surrogate's value. verl's sampler is ``torch.randperm``; ours
  draws uniform keys from ``key``: both give a uniformly random subset, not the same one.
* ``⌊ratio·N⌋`` is computed in float32 with a 1e-6 relative allowance, so that an exact
  product such as 10000·0.0002 = 2 is not floored to 1 by rounding.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.objectives._util import masked_min_max, token_advantages
from jaxrl_llm.objectives.aggregation import AggregationMode, aggregate_parts
from jaxrl_llm.ops.masked import masked_count, masked_mean, safe_divide

_MAX_LOG_RATIO = 20.0


def token_covariance(logp: jax.Array, advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-token centred product ``Cov_t`` of log-prob and advantage over the valid tokens.

    ``Cov_t = (log π(y_t) − mean_j log π(y_j))·(A_t − mean_j A_j)``, the means over every
    valid token of the batch (Cui et al. 2025, https://arxiv.org/abs/2505.22617, the token
    selection score of KL-Cov and Clip-Cov). ``masked_mean(token_covariance(...), mask)`` is
    the batch covariance (1/N normalisation), which the paper tracks beside the entropy.

    Args:
      logp: ``[B, T]`` log π(y_t). advantages: ``[B]`` or ``[B, T]``.
      mask: ``[B, T]`` 1 = valid token.

    Returns:
      ``[B, T]`` float32, 0 at padding, no gradient.
    """
    chex.assert_rank([logp, mask], 2)
    chex.assert_equal_shape([logp, mask])
    m = mask.astype(bool)
    adv = jnp.where(m, token_advantages(advantages, logp.shape).astype(jnp.float32), 0.0)
    lp = jnp.where(m, logp.astype(jnp.float32), 0.0)
    cov = (lp - masked_mean(lp, m)) * (adv - masked_mean(adv, m))
    return jax.lax.stop_gradient(jnp.where(m, cov, 0.0))


def _selection_count(m: jax.Array, ratio: float) -> tuple[jax.Array, int]:
    """``max(1, ⌊ratio·N⌋)`` with N the valid tokens (int32, traced), and its static bound for
    N = B·T (every token valid)."""
    n = masked_count(m)
    k = jnp.maximum(1, jnp.floor(n * ratio * (1.0 + 1e-6)).astype(jnp.int32))
    k_max = max(1, math.floor(m.size * ratio * (1.0 + 1e-6)))
    return k, min(k_max, m.size)


def _top(score: jax.Array, k: jax.Array, k_max: int) -> jax.Array:
    """Boolean ``[B, T]``: the ``k`` (traced, ≤ ``k_max``) largest entries of ``score``.

    ``lax.top_k`` with the static bound ``k_max`` rather than a full sort: the selected share
    is tiny (2e-4), so this costs about as much as the surrogate itself. Ties go to the
    lower flat (row-major) index.
    """
    flat = jnp.where(score == 0, 0.0, score).reshape(-1)  # −0.0 sorts below +0.0 in top_k
    _, idx = jax.lax.top_k(flat, k_max)
    chosen = jnp.arange(k_max) < k
    return jnp.zeros(flat.shape, bool).at[idx].set(chosen).reshape(score.shape)


def _check_ratio(name: str, ratio: float) -> None:
    if not 0.0 < ratio <= 1.0:
        raise ConfigError(f"{name}={ratio} must be in (0, 1] (verl's default is 2e-4)")


def _ratio_metrics(log_ratio, m) -> dict[str, jax.Array]:
    ratio = jnp.exp(jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    out = {
        "approx_kl": masked_mean(jnp.expm1(log_ratio) - log_ratio, m),
        "ratio_mean": masked_mean(ratio, m),
    }
    out["ratio_min"], out["ratio_max"] = masked_min_max(ratio, m)
    return out


def _prepare(logp, old_logp, advantages, mask):
    chex.assert_rank([logp, old_logp, mask], 2)
    chex.assert_equal_shape([logp, old_logp, mask])
    advantages = token_advantages(advantages, logp.shape)
    m = mask.astype(bool)
    logp = jnp.where(m, logp.astype(jnp.float32), 0.0)
    old = jax.lax.stop_gradient(jnp.where(m, old_logp.astype(jnp.float32), 0.0))
    adv = jax.lax.stop_gradient(jnp.where(m, advantages.astype(jnp.float32), 0.0))
    log_ratio = jnp.where(m, jnp.clip(logp - old, -_MAX_LOG_RATIO, _MAX_LOG_RATIO), 0.0)
    return m, logp, adv, log_ratio


def kl_cov_loss_parts(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    kl_cov_ratio: float = 0.0002,
    kl_coef: float = 1.0,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`kl_cov_loss` as ``(num, den, metrics)`` with ``loss = num / den``.

    The token selection uses this call's tokens (see the module docstring); for that
    selection, summing ``num`` and ``den`` over micro-batches gives the exact global loss.
    Arguments and metrics as :func:`kl_cov_loss`.
    """
    _check_ratio("kl_cov_ratio", kl_cov_ratio)
    m, logp, adv, log_ratio = _prepare(logp, old_logp, advantages, mask)
    cov = token_covariance(logp, adv, m)
    k, k_max = _selection_count(m, kl_cov_ratio)
    selected = _top(jnp.where(m, cov, -jnp.inf), k, k_max) & m
    ratio = jnp.exp(log_ratio)
    pg = -adv * ratio
    abs_kl = jnp.abs(log_ratio)
    per_token = jnp.where(m, pg + jnp.where(selected, kl_coef * abs_kl, 0.0), 0.0)
    num, den = aggregate_parts(per_token, mask, mode=aggregation, max_len=max_len)
    metrics = {
        "pg_loss": masked_mean(pg, m),
        "abs_kl": masked_mean(abs_kl, m),
        "kl_cov_frac": masked_mean(selected.astype(jnp.float32), m),
        "cov_mean": masked_mean(cov, m),
        "cov_selected_min": masked_min_max(cov, selected)[0],
        **_ratio_metrics(log_ratio, m),
    }
    return num, den, {k_: jax.lax.stop_gradient(v) for k_, v in metrics.items()}


def kl_cov_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    kl_cov_ratio: float = 0.0002,
    kl_coef: float = 1.0,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """KL-Cov: the policy gradient plus ``kl_coef·|log r|`` on the top-covariance tokens.

    ``ℓ_t = −A_t·r_t + 1[t ∈ I]·kl_coef·|log π_θ(y_t) − log π_old(y_t)|`` where ``I`` is the
    ``max(1, ⌊kl_cov_ratio·N⌋)`` valid tokens with the largest :func:`token_covariance`
    (Cui et al. 2025, https://arxiv.org/abs/2505.22617, the KL-Cov objective; defaults
    ratio 2e-4 and coefficient 1 as in verl's recipe). The ratio is not clipped, as in the
    paper. See the module docstring for the selection conventions.

    Args:
      logp: ``[B, T]`` log π_θ(y_t) (differentiated).
      old_logp: ``[B, T]`` log π_old(y_t) (constant).
      advantages: ``[B]`` or ``[B, T]`` (constant).
      mask: ``[B, T]`` 1 = valid response token.
      kl_cov_ratio: share of valid tokens penalised, in (0, 1].
      kl_coef: weight of the |log r| penalty (verl's ``ppo_kl_coef``).
      aggregation: an :class:`~jaxrl_llm.objectives.AggregationMode` or its string.
      max_len: constant length for ``seq_mean_token_sum_norm``.

    Returns:
      ``(loss, metrics)``: scalar float32 loss and scalar metrics (no gradient): ``pg_loss``
      (token mean of −A·r), ``abs_kl`` (token mean of |log r|, verl's ``ppo_kl`` here),
      ``kl_cov_frac`` (share of penalised tokens), ``cov_mean`` (batch covariance),
      ``cov_selected_min`` (smallest selected Cov_t), ``approx_kl``, ``ratio_mean``,
      ``ratio_min``, ``ratio_max``.
    """
    num, den, metrics = kl_cov_loss_parts(
        logp,
        old_logp,
        advantages,
        mask,
        kl_cov_ratio=kl_cov_ratio,
        kl_coef=kl_coef,
        aggregation=aggregation,
        max_len=max_len,
    )
    return safe_divide(num, den), metrics


def clip_cov_loss_parts(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    key: jax.Array,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """:func:`clip_cov_loss` as ``(num, den, metrics)`` with ``loss = num / den``.

    The selection uses this call's tokens and ``key`` (see the module docstring). Arguments
    and metrics as :func:`clip_cov_loss`.
    """
    _check_ratio("clip_cov_ratio", clip_cov_ratio)
    if clip_cov_lb >= clip_cov_ub:
        raise ConfigError(f"clip_cov_lb={clip_cov_lb} must be < clip_cov_ub={clip_cov_ub}")
    eps_low = float(clip_eps)
    eps_high = float(clip_eps if clip_eps_high is None else clip_eps_high)
    if eps_low < 0 or eps_high < 0:
        raise ConfigError(f"clip_eps={clip_eps} and clip_eps_high={clip_eps_high} must be >= 0")
    m, logp, adv, log_ratio = _prepare(logp, old_logp, advantages, mask)
    ratio = jnp.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    ppo_clipped = (pg2 > pg1) & m
    per_token = jnp.maximum(pg1, pg2)

    cov = token_covariance(logp, adv, m)
    candidate = m & ~ppo_clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    draw = jax.random.uniform(key, cov.shape)
    selected = _top(jnp.where(candidate, draw, -jnp.inf), *_selection_count(m, clip_cov_ratio))
    selected = selected & candidate
    per_token = jnp.where(selected, jax.lax.stop_gradient(per_token), per_token)
    per_token = jnp.where(m, per_token, 0.0)
    num, den = aggregate_parts(per_token, mask, mode=aggregation, max_len=max_len)
    metrics = {
        "pg_loss": masked_mean(per_token, m),
        "clipfrac": masked_mean(ppo_clipped.astype(jnp.float32), m),
        "cov_clipfrac": masked_mean(selected.astype(jnp.float32), m),
        "cov_candidate_frac": masked_mean(candidate.astype(jnp.float32), m),
        "cov_mean": masked_mean(cov, m),
        **_ratio_metrics(log_ratio, m),
    }
    return num, den, {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}


def clip_cov_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    key: jax.Array,
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    max_len: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clip-Cov: PPO's clipped surrogate with a random few mid-high-covariance tokens detached.

    ``ℓ_t = max(−A_t·r_t, −A_t·clip(r_t, 1 − ε_low, 1 + ε_high))`` for every token, with
    ``stop_gradient`` on the tokens of ``I``: a uniformly random subset (PRNG ``key``) of
    size ``min(|C|, max(1, ⌊clip_cov_ratio·N⌋))`` of the candidates ``C`` = valid tokens not
    clipped by PPO with ``clip_cov_lb < Cov_t < clip_cov_ub`` (:func:`token_covariance`).
    Cui et al. 2025, https://arxiv.org/abs/2505.22617, the Clip-Cov objective; defaults
    ratio 2e-4, bounds (1, 5) and ε = 0.2 as in verl's recipe. See the module docstring for
    how this differs from verl (detach vs. zero: same gradient).

    Args:
      logp: ``[B, T]`` log π_θ(y_t) (differentiated).
      old_logp: ``[B, T]`` log π_old(y_t) (constant).
      advantages: ``[B]`` or ``[B, T]`` (constant).
      mask: ``[B, T]`` 1 = valid response token.
      clip_cov_ratio: share of valid tokens to detach at most, in (0, 1].
      clip_cov_lb: lower covariance bound (exclusive). clip_cov_ub: upper bound (exclusive).
      clip_eps: PPO's ε_low (and ε_high when ``clip_eps_high`` is None).
      clip_eps_high: PPO's ε_high, or None.
      key: a ``jax.random`` key for the random subset.
      aggregation: an :class:`~jaxrl_llm.objectives.AggregationMode` or its string.
      max_len: constant length for ``seq_mean_token_sum_norm``.

    Returns:
      ``(loss, metrics)``: scalar float32 loss and scalar metrics (token means, no gradient):
      ``pg_loss``, ``clipfrac`` (PPO-clipped share), ``cov_clipfrac`` (detached share),
      ``cov_candidate_frac``, ``cov_mean``, ``approx_kl``, ``ratio_mean``, ``ratio_min``,
      ``ratio_max``.
    """
    num, den, metrics = clip_cov_loss_parts(
        logp,
        old_logp,
        advantages,
        mask,
        clip_cov_ratio=clip_cov_ratio,
        clip_cov_lb=clip_cov_lb,
        clip_cov_ub=clip_cov_ub,
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        key=key,
        aggregation=aggregation,
        max_len=max_len,
    )
    return safe_divide(num, den), metrics
