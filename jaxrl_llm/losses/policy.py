"""Online RL policy losses (PPO actor, GRPO, Dr. GRPO, DAPO, GSPO, REINFORCE, REINFORCE++,
RLOO, ReMax) and the PPO critic loss.

All the policy-gradient algorithms share one loss, :func:`policy_gradient_loss`; they differ
only in data, a :class:`PolicyGradientConfig` (clip range, clip-higher, token- or
sequence-level ratio, aggregation, in-loss KL term, entropy bonus). One preset function per
algorithm returns its config (:mod:`jaxrl_llm.losses.policy_config`) with the paper's defaults; the surrogate term itself (clipped,
with rollout-correction weights, or KL-Cov / Clip-Cov) is :mod:`jaxrl_llm.losses.policy_terms`.
Advantages are precomputed in the batch (the estimator runs in the RL loop before the update);
the ``advantage`` field of the algorithm's registry entry (``jaxrl_llm.losses.ALGORITHMS``)
names the estimator it is defined with. How log-probs are computed (sampling temperature, chunking, the completion window, the
shared prompt of a group) is not a hyperparameter: it is the ``logprobs`` argument
(:class:`~jaxrl_llm.losses.common.LogprobSettings`).

The scalar hyperparameters in :data:`TRACED_HPARAMS` may also come as traced values
(``hparams={"kl_coef": β_t}``), so that a schedule of β or ε does not recompile the step; the
config's values decide the loss's structure (a KL term exists when ``config.kl_coef > 0``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
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
    shift_right,
)
from jaxrl_llm.losses.policy_config import (  # noqa: F401  (public here too)
    TRACED_HPARAMS,
    AdvantageEstimator,
    EntropyControl,
    PolicyGradientConfig,
    check_entropy_control,
)
from jaxrl_llm.losses.policy_terms import batch_key, surrogate_parts  # noqa: F401
from jaxrl_llm.objectives.aggregation import (
    AggregationMode,
    aggregate_parts,
    aggregation_denominator,
)
from jaxrl_llm.objectives.kl import KLKind, kl_penalty
from jaxrl_llm.objectives.policy import RatioLevel
from jaxrl_llm.objectives.value import value_loss_parts
from jaxrl_llm.ops.masked import masked_mean


def ppo_actor_config(**overrides) -> PolicyGradientConfig:
    """PPO actor (Schulman et al. 2017, https://arxiv.org/abs/1707.06347; RLHF as in
    Ouyang et al. 2022): ε = 0.2, token ratio, token_mean, GAE advantages, KL in the reward
    (kl_coef = 0), entropy bonus c₂ (default 0 as in RLHF-PPO implementations; the PPO paper
    used 0.01 on Atari)."""
    return PolicyGradientConfig(**overrides)


def grpo_config(**overrides) -> PolicyGradientConfig:
    """GRPO (Shao et al. 2024, DeepSeekMath, https://arxiv.org/abs/2402.03300, eq. 3):
    ε = 0.2, β = 0.04 with the k3 estimator in the loss, per-sequence mean of per-token
    means (1/G Σ_i 1/|o_i| Σ_t), group-normalised advantages."""
    base = dict(
        clip_eps=0.2,
        kl_coef=0.04,
        kl_kind=KLKind.K3,
        aggregation=AggregationMode.SEQ_MEAN_TOKEN_MEAN,
    )
    return PolicyGradientConfig(**{**base, **overrides})


def dr_grpo_config(*, max_len: int = 1024, **overrides) -> PolicyGradientConfig:
    """Dr. GRPO (Liu et al. 2025, https://arxiv.org/abs/2503.20783): GRPO without the length
    and std biases: Σ_bt l·m / (B·max_len) (``seq_mean_token_sum_norm``), advantages
    r − mean_group without std scaling, no KL term (β = 0). Set ``max_len`` to the
    generation budget."""
    base = dict(
        clip_eps=0.2,
        kl_coef=0.0,
        max_len=max_len,
        aggregation=AggregationMode.SEQ_MEAN_TOKEN_SUM_NORM,
    )
    return PolicyGradientConfig(**{**base, **overrides})


def dapo_config(**overrides) -> PolicyGradientConfig:
    """DAPO (Yu et al. 2025, https://arxiv.org/abs/2503.14476): clip-higher ε_low = 0.2,
    ε_high = 0.28, token-level mean over all tokens of the batch, no KL term; group-normalised
    advantages (dynamic sampling and overlong shaping live in the RL loop)."""
    base = dict(
        clip_eps=0.2, clip_eps_high=0.28, kl_coef=0.0, aggregation=AggregationMode.TOKEN_MEAN
    )
    return PolicyGradientConfig(**{**base, **overrides})


def gspo_config(**overrides) -> PolicyGradientConfig:
    """GSPO (Zheng et al. 2025, https://arxiv.org/abs/2507.18071): sequence-level ratio
    s_i = exp((1/|y_i|) Σ_t log ρ_it), clip range (1 − 3e-4, 1 + 4e-4) as in the paper,
    one term per sequence (seq_mean_token_mean), no KL term, group-normalised advantages."""
    base = dict(
        clip_eps=3e-4,
        clip_eps_high=4e-4,
        ratio_level=RatioLevel.SEQUENCE,
        kl_coef=0.0,
        aggregation=AggregationMode.SEQ_MEAN_TOKEN_MEAN,
    )
    return PolicyGradientConfig(**{**base, **overrides})


def reinforce_config(**overrides) -> PolicyGradientConfig:
    """Vanilla REINFORCE (Williams 1992): L = −Σ_t log π(y_t)·A_t, no clipping, token_mean,
    KL folded into the reward."""
    base = dict(clip_eps=None, kl_coef=0.0, aggregation=AggregationMode.TOKEN_MEAN)
    return PolicyGradientConfig(**{**base, **overrides})


def reinforce_pp_config(**overrides) -> PolicyGradientConfig:
    """REINFORCE++ (Hu 2025, https://arxiv.org/abs/2501.03262): PPO-clip ε = 0.2,
    token_mean, token-level KL folded into the reward (k1) and no critic; advantages are the
    discounted returns whitened over the global batch."""
    base = dict(clip_eps=0.2, kl_coef=0.0, aggregation=AggregationMode.TOKEN_MEAN)
    return PolicyGradientConfig(**{**base, **overrides})


def rloo_config(**overrides) -> PolicyGradientConfig:
    """RLOO (Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740): REINFORCE with the
    leave-one-out baseline, the whole completion as one action (per-sequence sum of token
    terms, seq_mean_token_sum), KL in the reward; clipping ε = 0.2 (as TRL's RLOOTrainer) so
    several updates per batch stay proximal."""
    base = dict(clip_eps=0.2, kl_coef=0.0, aggregation=AggregationMode.SEQ_MEAN_TOKEN_SUM)
    return PolicyGradientConfig(**{**base, **overrides})


def remax_config(**overrides) -> PolicyGradientConfig:
    """ReMax (Li et al. 2023, https://arxiv.org/abs/2310.10505): REINFORCE with the greedy
    completion's reward as baseline, L = −(1/B) Σ_b Σ_t log π(y_bt)·(r_b − r̄_b), no clipping
    (one on-policy update), seq_mean_token_sum, KL in the reward."""
    base = dict(clip_eps=None, kl_coef=0.0, aggregation=AggregationMode.SEQ_MEAN_TOKEN_SUM)
    return PolicyGradientConfig(**{**base, **overrides})


# ----- the loss -------------------------------------------------------------------------------

# objectives.policy_loss metric name -> logged name (the field's "pg/..." names).
_PG_METRIC_NAMES = {"kl": "kl", "pg_loss": "pg/token_loss"}


def policy_gradient_denominator(batch: Batch, config: PolicyGradientConfig) -> jax.Array:
    """Denominator of :func:`policy_gradient_loss` over ``batch`` (depends on loss_mask only)."""
    mask = require(batch, "loss_mask", loss="policy_gradient")
    return aggregation_denominator(mask, mode=config.aggregation, max_len=config.max_len)


def policy_gradient_zero_batch(config: PolicyGradientConfig) -> Callable[[Batch], jax.Array] | None:
    """``is_zero(batch) -> bool scalar``: True when :func:`policy_gradient_loss` and its
    gradient are exactly 0 on ``batch`` (given the full-batch ``loss_denominator``), so a train
    step may skip its forward and backward; None when ``config`` has a term that does not
    vanish with the advantages (``kl_coef > 0`` or ``entropy_coef > 0``).

    Every surrogate term is ``−min(ρ·A, clip(ρ)·A)`` (or the dual clip's ``max(·, c·A)``), so a
    row whose advantages are 0 contributes 0 to the loss and to the gradient. In GRPO-style
    groups this is every group whose rewards are all equal, which DAPO (Yu et al. 2025,
    https://arxiv.org/abs/2503.14476, §3.2) notes "results in zero policy gradients"; on the
    2-digit addition job most groups of 4 are such groups.
    """
    if config.kl_coef > 0 or config.entropy_coef > 0:
        return None
    if config.entropy_control is EntropyControl.KL_COV:
        return None  # |log ρ| on the selected tokens has a gradient whatever the advantages

    def is_zero(batch: Batch) -> jax.Array:
        mask = batch["loss_mask"].astype(bool)
        adv = batch["advantages"]
        if adv.ndim == 1:
            adv = adv[:, None]
        return jnp.all(jnp.where(mask, adv, 0.0) == 0.0)

    return is_zero


def policy_gradient_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: PolicyGradientConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
    hparams: Mapping[str, jax.Array] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate policy loss over parameters (PPO / GRPO / DAPO / GSPO / REINFORCE...).

    L = agg_t[ −min(ρ_t A_t, clip(ρ_t, 1−ε, 1+ε_high) A_t) + β·KL_t ] − c₂·agg_t[H_t],
    ρ_t = π_θ(y_t)/π_old(y_t) (or GSPO's sequence ratio). We minimise loss = −objective.
    With ``config.entropy_control`` the surrogate term is KL-Cov's or Clip-Cov's (Cui et al.
    2025, https://arxiv.org/abs/2505.22617; :class:`EntropyControl`); β·KL and c₂·H stay.
    Optional batch corrections (``objectives.policy_loss``): ``is_weights [B, T]`` multiply
    each token's surrogate (TIS / MIS, Yao et al. 2025); ``proximal_logp [B, T]`` makes it
    decoupled PPO (AReaL, https://arxiv.org/abs/2505.24298) with ``old_logp`` the behaviour
    policy.

    Args:
      params: policy parameters.
      batch: sequence batch ``input_ids``, ``attention_mask``, ``loss_mask`` ``[B, T]`` plus
        ``advantages [B, T]`` (precomputed); ``old_logp [B, T]`` (when absent the update is
        on-policy: old_logp = stop_gradient(logp), ρ = 1); ``ref_logp [B, T]`` (required when
        ``kl_coef > 0``); optional ``loss_denominator``, ``is_weights [B, T]`` and
        ``proximal_logp [B, T]`` (see above; the online loop's ``rollout.correction``).
      apply_fn: model apply function.
      config: :class:`PolicyGradientConfig` (from a preset such as :func:`grpo_config`).
      logprobs: :class:`~jaxrl_llm.losses.common.LogprobSettings` (τ, chunking, window,
        shared prompt).
      hparams: traced values of some of :data:`TRACED_HPARAMS` (override the config's; a
        term the config switches off, such as ``kl_coef = 0``, stays off).

    Returns:
      ``(loss, metrics)``; metrics include ``loss``, ``pg/loss``, ``pg/clipfrac``,
      ``pg/clipfrac_low``, ``pg/clipfrac_high``, ``pg/approx_kl``, ``entropy`` and ``kl``
      (when ``ref_logp`` is given), as reported by ``objectives.policy_loss``.
    """
    name = "policy_gradient"
    hp = {k: getattr(config, k) for k in TRACED_HPARAMS}
    unknown = sorted(set(hparams or {}) - set(hp))
    if unknown:
        raise ConfigError(f"hparams {unknown} cannot be traced; traceable: {list(hp)}")
    hp.update(hparams or {})
    logp, ent, _ = forward_logps(
        params, batch, apply_fn=apply_fn, with_entropy=True, loss=name, **logprobs.kwargs()
    )
    assert ent is not None  # with_entropy=True
    mask = batch["loss_mask"]
    adv = require(
        batch,
        "advantages",
        loss=name,
        hint="compute them with an objectives.*_advantages estimator first",
    )
    old_logp = batch.get("old_logp")
    if old_logp is None:
        old_logp = jax.lax.stop_gradient(logp)
    ref_logp = batch.get("ref_logp")
    if config.kl_coef > 0 and ref_logp is None:
        require(
            batch,
            "ref_logp",
            loss=name,
            hint=f"kl_coef={config.kl_coef} > 0 needs reference log-probs "
            "(losses.sequence_logps with the reference params) or set kl_coef=0",
        )
    m = mask.astype(bool)
    adv = jnp.where(m, adv, 0.0)
    old_logp = jnp.where(m, old_logp, 0.0)
    if ref_logp is not None:
        ref_logp = jnp.where(m, ref_logp, 0.0)

    num, den, pg_metrics = surrogate_parts(logp, old_logp, adv, mask, batch, config, ref_logp)
    pg_num = num
    if config.kl_coef > 0:
        # β·KL added here rather than inside the objective so that β may be traced: the
        # aggregation is linear, so Σ agg(pg + β·kl) = agg(pg) + β·agg(kl), same denominator.
        assert ref_logp is not None  # required above when kl_coef > 0
        ref = jax.lax.stop_gradient(ref_logp.astype(jnp.float32))
        kl = jnp.where(m, kl_penalty(logp.astype(jnp.float32), ref, kind=config.kl_kind), 0.0)
        kl_num, _ = aggregate_parts(kl, mask, mode=config.aggregation, max_len=config.max_len)
        num = num + hp["kl_coef"] * kl_num
    if config.entropy_coef:
        ent_num, _ = aggregate_parts(ent, mask, mode=config.aggregation, max_len=config.max_len)
        num = num - hp["entropy_coef"] * ent_num
    loss = finish(num, den, batch)

    metrics = {
        _PG_METRIC_NAMES.get(k, f"pg/{k}"): jax.lax.stop_gradient(v) for k, v in pg_metrics.items()
    }
    metrics["pg/loss"] = jax.lax.stop_gradient(finish(pg_num, den, batch))
    metrics["loss"] = loss
    metrics["entropy"] = jax.lax.stop_gradient(masked_mean(ent, mask))
    return loss, metrics


# ----- PPO critic -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CriticConfig:
    """PPO value-function (critic) loss.

    Attributes:
      value_clip: clip the new values to old ± value_clip (PPO2 value clipping, OpenAI
        baselines; 0.2 in OpenRLHF); None disables it.
      aggregation: reduction of per-token value errors (default ``token_mean``).
      max_len: constant length for ``seq_mean_token_sum_norm``.
    """

    value_clip: float | None = 0.2
    aggregation: AggregationMode = AggregationMode.TOKEN_MEAN
    max_len: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "aggregation", AggregationMode(self.aggregation))
        if self.value_clip is not None and not self.value_clip > 0:
            raise ConfigError(f"value_clip={self.value_clip!r} must be > 0 (or None)")


def ppo_critic_config(**overrides) -> CriticConfig:
    """Preset for the PPO critic (clipped value loss, ε_v = 0.2, token_mean)."""
    return CriticConfig(**overrides)


def critic_denominator(batch: Batch, config: CriticConfig) -> jax.Array:
    """Denominator of :func:`ppo_critic_loss` over ``batch``."""
    mask = require(batch, "loss_mask", loss="ppo_critic")
    return aggregation_denominator(mask, mode=config.aggregation, max_len=config.max_len)


def critic_values(params: Any, batch: Batch, *, apply_fn: ApplyFn) -> jax.Array:
    """Per-token values ``[B, T]`` aligned to ``input_ids``: V(s_t) for the state before
    token t, i.e. the scalar head at position t−1 (0 at t = 0 and where loss_mask is 0).

    This is what the RL loop stores as ``values`` for GAE, from the same compiled code.
    """
    ids = require(batch, "input_ids", loss="ppo_critic")
    mask = require(batch, "loss_mask", loss="ppo_critic")
    attn = batch.get("attention_mask")
    attn = jnp.ones(ids.shape, jnp.int32) if attn is None else attn
    out = apply_fn(
        params,
        ids,
        attention_mask=attn,
        positions=batch.get("positions"),
        segment_ids=batch.get("segment_ids"),
    )
    if out.scalar is None:
        raise ConfigError(
            "the ppo_critic loss needs a model with a scalar head (ModelConfig.num_labels=1)"
        )
    return jnp.where(mask.astype(bool), shift_right(out.scalar[:, :-1]), 0.0)


def ppo_critic_loss(
    params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: CriticConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped value loss over critic parameters.

    L = agg_t ½·max((V_t − R_t)², (clip(V_t, V_old,t ± ε_v) − R_t)²) as
    ``objectives.value_loss`` defines it (PPO, https://arxiv.org/abs/1707.06347).

    Args:
      params: critic parameters (a model with a scalar head).
      batch: sequence batch plus ``values [B, T]`` (old values recorded at rollout) and
        ``returns [B, T]``; optional ``loss_denominator``.
      apply_fn: model apply function of the critic.
      config: :class:`CriticConfig`.

    Returns:
      ``(loss, metrics)``: ``loss``, ``vf/loss``, ``vf/clipfrac``, ``vf/values``, ...
    """
    del logprobs  # values come from the scalar head
    name = "ppo_critic"
    values = critic_values(params, batch, apply_fn=apply_fn)
    mask = batch["loss_mask"]
    m = mask.astype(bool)
    old_values = jnp.where(m, require(batch, "values", loss=name), 0.0)
    returns = jnp.where(m, require(batch, "returns", loss=name), 0.0)
    num, den, vf_metrics = value_loss_parts(
        values,
        old_values,
        returns,
        mask,
        clip=config.value_clip,
        aggregation=config.aggregation,
        max_len=config.max_len,
    )
    loss = finish(num, den, batch)
    names = {"vf_clipfrac": "vf/clipfrac", "value_mean": "vf/values", "value_mse": "vf/mse"}
    metrics = {names.get(k, f"vf/{k}"): jax.lax.stop_gradient(v) for k, v in vf_metrics.items()}
    metrics["vf/loss"] = jax.lax.stop_gradient(loss)
    metrics["loss"] = loss
    return loss, metrics
