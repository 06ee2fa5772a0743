"""The surrogate term of the clipped policy-gradient loss (:mod:`jaxrl_llm.losses.policy`; its configuration is
:mod:`jaxrl_llm.losses.policy_config`):
PPO's clipped surrogate with the batch's rollout-correction entries, or one of the two
entropy-control surrogates of Cui et al. 2025.

* Rollout correction (the online loop's ``rollout.correction``, :mod:`jaxrl_llm.train.
  correction`): ``is_weights [B, T]`` multiply each token's surrogate (TIS / MIS, Yao et al.
  2025, https://fengyao.notion.site/off-policy-rl); ``proximal_logp [B, T]`` makes it decoupled
  PPO with ``old_logp`` the behaviour policy (Fu et al. 2025, AReaL,
  https://arxiv.org/abs/2505.24298). Both go to :func:`jaxrl_llm.objectives.policy_loss_parts`.
* Entropy control (``loss.entropy_control``, :class:`EntropyControl`): KL-Cov and Clip-Cov
  (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
  Models", https://arxiv.org/abs/2505.22617; :mod:`jaxrl_llm.objectives.entropy_control`).
  Clip-Cov's random subset is keyed by the micro-batch's tokens (:func:`batch_key`), so the
  loss stays a pure function of its inputs.

The two do not combine yet: :func:`surrogate_parts` refuses a batch with correction entries
under an entropy-controlled config (and the run config refuses the pair before anything runs).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses.common import Batch
from jaxrl_llm.losses.policy_config import EntropyControl, PolicyGradientConfig
from jaxrl_llm.objectives.entropy_control import clip_cov_loss_parts, kl_cov_loss_parts
from jaxrl_llm.objectives.kl import kl_penalty
from jaxrl_llm.objectives.policy import policy_loss_parts
from jaxrl_llm.ops.masked import masked_mean


def batch_key(input_ids: jax.Array) -> jax.Array:
    """A PRNG key that is a function of a batch's token ids (a multiplicative hash of ids and
    positions): randomness inside a jitted loss (Clip-Cov's subset) without a key argument,
    the same for the same batch."""
    ids = input_ids.astype(jnp.uint32).reshape(-1)
    pos = jnp.arange(1, ids.size + 1, dtype=jnp.uint32)
    h = jnp.sum((ids + jnp.uint32(1)) * pos * jnp.uint32(2654435761), dtype=jnp.uint32)
    return jax.random.fold_in(jax.random.PRNGKey(0x5EED), h)


def surrogate_parts(
    logp: jax.Array,
    old_logp: jax.Array,
    adv: jax.Array,
    mask: jax.Array,
    batch: Batch,
    config: PolicyGradientConfig,
    ref_logp: jax.Array | None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """``(num, den, metrics)`` of the per-token surrogate of ``config``: clipped (with the
    batch's ``is_weights`` / ``proximal_logp``), KL-Cov or Clip-Cov.

    Args:
      logp, old_logp, adv, mask: ``[B, T]`` (``adv`` may be ``[B]``), masked by the caller.
      batch: the loss's batch (its ``is_weights``, ``proximal_logp`` and, for Clip-Cov's key,
        ``input_ids``).
      config: the :class:`~jaxrl_llm.losses.policy.PolicyGradientConfig`.
      ref_logp: ``[B, T]`` or None; the clipped surrogate adds its ``kl`` metric (not the
        β·KL term, which the loss adds so that β may be traced); the entropy-controlled ones
        report the same metric here.

    Raises:
      ConfigError: correction entries in the batch with entropy control on.
    """
    ec = config.entropy_control
    is_weights = batch.get("is_weights")
    proximal_logp = batch.get("proximal_logp")
    common: dict[str, Any] = dict(aggregation=config.aggregation, max_len=config.max_len)
    if ec is EntropyControl.NONE:
        return policy_loss_parts(
            logp,
            old_logp,
            adv,
            mask,
            # No clipping: an infinite range (clip(ρ, −∞, ∞) = ρ).
            clip_eps=float("inf") if config.clip_eps is None else config.clip_eps,
            clip_eps_high=config.clip_eps_high,
            dual_clip=config.dual_clip,
            ratio_level=config.ratio_level,
            ref_logp=ref_logp,
            kl_kind=config.kl_kind,
            is_weights=is_weights,
            proximal_logp=proximal_logp,
            **common,
        )
    if is_weights is not None or proximal_logp is not None:
        raise ConfigError(
            f"entropy_control={ec.value!r} does not take rollout-correction weights yet; "
            "use one or the other"
        )
    if ec is EntropyControl.KL_COV:
        num, den, metrics = kl_cov_loss_parts(
            logp,
            old_logp,
            adv,
            mask,
            kl_cov_ratio=config.kl_cov_ratio,
            kl_coef=config.kl_cov_coef,
            **common,
        )
    else:
        assert config.clip_eps is not None  # checked by the config
        num, den, metrics = clip_cov_loss_parts(
            logp,
            old_logp,
            adv,
            mask,
            clip_cov_ratio=config.clip_cov_ratio,
            clip_cov_lb=config.clip_cov_lb,
            clip_cov_ub=config.clip_cov_ub,
            clip_eps=config.clip_eps,
            clip_eps_high=config.clip_eps_high,
            key=batch_key(batch["input_ids"]),
            **common,
        )
    if ref_logp is not None:  # the ``kl`` metric, as the clipped surrogate reports it
        m = mask.astype(bool)
        lp = jnp.where(m, logp.astype(jnp.float32), 0.0)
        kl = jnp.where(m, kl_penalty(lp, ref_logp.astype(jnp.float32), kind=config.kl_kind), 0.0)
        metrics["kl"] = jax.lax.stop_gradient(masked_mean(kl, m))
    return num, den, metrics
