"""The 2025–26 group-policy-gradient surrogates over parameters: CISPO, SAPO, GMPO.

Each is the same data path as :func:`~jaxrl_llm.losses.policy.policy_gradient_loss` (an
``rl`` batch with precomputed advantages and behaviour log-probs ``old_logp``) with another
per-token objective from :mod:`jaxrl_llm.objectives.surrogates`. They are registered as group
policy-gradient algorithms (``cispo``, ``sapo``, ``gmpo``): the online loop, the strategy and
the learner are the GRPO ones, nothing in ``train/`` knows them by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses.common import (
    DEFAULT_LOGPROBS,
    ApplyFn,
    Batch,
    LogprobSettings,
    finish,
    forward_logps,
    require,
    row_valid,
)
from jaxrl_llm.objectives.aggregation import AggregationMode, aggregation_denominator
from jaxrl_llm.objectives.surrogates import cispo_loss_parts, gmpo_loss_parts, sapo_loss_parts
from jaxrl_llm.ops.masked import masked_count, masked_mean


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CISPOConfig:
    """CISPO (MiniMax-M1, Chen et al. 2025, https://arxiv.org/abs/2506.13585): the clipped
    importance weight is a constant factor, so every token keeps its gradient.

    Attributes:
      clip_eps_low: lower bound 1 − ε_low of the weight (None: no lower bound, the paper's
        setting); clip_eps_high: upper bound 1 + ε_high (the paper tunes it; 0.2 here).
      aggregation: token_mean (the paper's token-level normalisation); max_len for
        ``seq_mean_token_sum_norm``.
    """

    clip_eps_low: float | None = None
    clip_eps_high: float | None = 0.2
    aggregation: AggregationMode = AggregationMode.TOKEN_MEAN
    max_len: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "aggregation", AggregationMode(self.aggregation))
        for name in ("clip_eps_low", "clip_eps_high"):
            v = getattr(self, name)
            if v is not None and not v >= 0:
                raise ConfigError(f"{name}={v!r} must be >= 0 (or None: no bound)")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SAPOConfig:
    """SAPO (Qwen team 2025): a sigmoid gate of temperature τ on the ratio instead of a hard
    clip; τ_neg > τ_pos damps negative-advantage tokens faster.

    Attributes:
      tau_pos, tau_neg: gate temperatures for A > 0 and A ≤ 0 (1.0 and 1.05 as the paper).
      aggregation: seq_mean_token_mean (the paper's GRPO-style average); max_len.
    """

    tau_pos: float = 1.0
    tau_neg: float = 1.05
    aggregation: AggregationMode = AggregationMode.SEQ_MEAN_TOKEN_MEAN
    max_len: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "aggregation", AggregationMode(self.aggregation))
        if not (self.tau_pos > 0 and self.tau_neg > 0):
            raise ConfigError(f"tau_pos={self.tau_pos} and tau_neg={self.tau_neg} must be > 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GMPOConfig:
    """GMPO (Zhao et al. 2025, https://arxiv.org/abs/2507.20673): the geometric mean of the
    token ratios per sequence, token log-ratios clipped to [−ε, ε] (ε = 0.4, the paper's).
    One term per sequence, mean over sequences."""

    clip_eps: float = 0.4

    def __post_init__(self):
        if not self.clip_eps > 0:
            raise ConfigError(f"clip_eps={self.clip_eps!r} must be > 0")


def cispo_config(**overrides) -> CISPOConfig:
    """Preset for CISPO (no lower bound, ε_high = 0.2, token_mean)."""
    return CISPOConfig(**overrides)


def sapo_config(**overrides) -> SAPOConfig:
    """Preset for SAPO (τ_pos = 1.0, τ_neg = 1.05, seq_mean_token_mean)."""
    return SAPOConfig(**overrides)


def gmpo_config(**overrides) -> GMPOConfig:
    """Preset for GMPO (ε = 0.4 on the token log-ratio)."""
    return GMPOConfig(**overrides)


def _rl_inputs(params, batch, apply_fn, logprobs, name):
    logp, ent, _ = forward_logps(
        params, batch, apply_fn=apply_fn, with_entropy=True, loss=name, **logprobs.kwargs()
    )
    mask = batch["loss_mask"]
    adv = require(
        batch,
        "advantages",
        loss=name,
        hint="compute them with an objectives.*_advantages estimator first",
    )
    old = batch.get("old_logp")
    old = jax.lax.stop_gradient(logp) if old is None else old
    m = mask.astype(bool)
    return logp, ent, jnp.where(m, old, 0.0), jnp.where(m, adv, 0.0), mask


def _finish(num, den, batch, metrics, ent, mask):
    loss = finish(num, den, batch)
    out = {
        f"pg/{k}" if k != "pg_loss" else "pg/token_loss": jax.lax.stop_gradient(v)
        for k, v in metrics.items()
    }
    out["pg/loss"] = jax.lax.stop_gradient(loss)
    out["loss"] = loss
    out["entropy"] = jax.lax.stop_gradient(masked_mean(ent, mask))
    return loss, out


def cispo_model_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: CISPOConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """CISPO over parameters: agg_t[−sg(clip(ρ_t, 1 − ε_low, 1 + ε_high))·A_t·log π_θ(y_t)]
    (:func:`jaxrl_llm.objectives.cispo_loss`). Batch and returns as
    :func:`~jaxrl_llm.losses.policy_gradient_loss` (optional ``is_weights``: rollout
    correction; no ``proximal_logp``)."""
    logp, ent, old, adv, mask = _rl_inputs(params, batch, apply_fn, logprobs, "cispo")
    num, den, m = cispo_loss_parts(
        logp,
        old,
        adv,
        mask,
        clip_eps_low=config.clip_eps_low,
        clip_eps_high=config.clip_eps_high,
        aggregation=config.aggregation,
        max_len=config.max_len,
        is_weights=batch.get("is_weights"),
    )
    return _finish(num, den, batch, m, ent, mask)


def sapo_model_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: SAPOConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """SAPO over parameters: agg_t[−(4/τ)·σ(τ(ρ_t − 1))·A_t] (:func:`jaxrl_llm.objectives.
    sapo_loss`). Batch and returns as :func:`~jaxrl_llm.losses.policy_gradient_loss`
    (optional ``is_weights``: rollout correction; no ``proximal_logp``)."""
    logp, ent, old, adv, mask = _rl_inputs(params, batch, apply_fn, logprobs, "sapo")
    num, den, m = sapo_loss_parts(
        logp,
        old,
        adv,
        mask,
        tau_pos=config.tau_pos,
        tau_neg=config.tau_neg,
        aggregation=config.aggregation,
        max_len=config.max_len,
        is_weights=batch.get("is_weights"),
    )
    return _finish(num, den, batch, m, ent, mask)


def gmpo_model_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: GMPOConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GMPO over parameters: mean over sequences of −A·exp(mean_t clip(log ρ_t))
    (:func:`jaxrl_llm.objectives.gmpo_loss`). Batch and returns as
    :func:`~jaxrl_llm.losses.policy_gradient_loss`."""
    logp, ent, old, adv, mask = _rl_inputs(params, batch, apply_fn, logprobs, "gmpo")
    num, den, m = gmpo_loss_parts(logp, old, adv, mask, clip_eps=config.clip_eps)
    return _finish(num, den, batch, m, ent, mask)


def token_denominator(batch: Batch, config: Any) -> jax.Array:
    """Denominator of the token-aggregated surrogates (CISPO, SAPO) over ``batch``."""
    mask = require(batch, "loss_mask", loss="surrogate")
    return aggregation_denominator(mask, mode=config.aggregation, max_len=config.max_len)


def sequence_denominator(batch: Batch, config: Any = None) -> jax.Array:
    """Denominator of GMPO over ``batch``: the rows with at least one completion token."""
    del config
    return masked_count(row_valid(require(batch, "loss_mask", loss="gmpo")))


def zero_advantage_batch(config: Any) -> Callable[[Batch], jax.Array]:
    """``is_zero(batch)``: every surrogate here is linear in the advantages, so a batch whose
    advantages are all 0 has loss and gradient exactly 0 (the step may skip it)."""
    del config

    def is_zero(batch: Batch) -> jax.Array:
        mask = batch["loss_mask"].astype(bool)
        adv = batch["advantages"]
        adv = adv[:, None] if adv.ndim == 1 else adv
        return jnp.all(jnp.where(mask, adv, 0.0) == 0.0)

    return is_zero
