"""The loss table: :data:`LOSSES`, loss name -> :class:`LossSpec` (the loss, its denominator,
its config class and paper preset, the reference pass it needs, the batches it may skip), one
explicit dict (no import side effects). The algorithm table that names these losses is
:data:`jaxrl_llm.losses.registry.ALGORITHMS`.

The train step looks a loss up here::

    spec = LOSSES["grpo"]
    config = spec.preset(kl_coef=0.02)                # frozen dataclass, paper defaults
    den = spec.denominator_fn(full_batch, config)      # once per optimizer step
    loss, metrics = spec.loss_fn(params, {**micro, "loss_denominator": den},
                                 apply_fn=apply_fn, config=config, logprobs=settings)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses.common import (
    DEFAULT_LOGPROBS,
    ApplyFn,
    Batch,
    LogprobSettings,
    sequence_logps,
)
from jaxrl_llm.losses.distill import (
    DistillConfig,
    distill_batch_kind,
    distill_config,
    distill_denominator,
    distill_loss,
    distill_uses_teacher,
)
from jaxrl_llm.losses.policy import (
    TRACED_HPARAMS,
    CriticConfig,
    PolicyGradientConfig,
    critic_denominator,
    dapo_config,
    dr_grpo_config,
    grpo_config,
    gspo_config,
    policy_gradient_denominator,
    policy_gradient_loss,
    policy_gradient_zero_batch,
    ppo_actor_config,
    ppo_critic_config,
    ppo_critic_loss,
    reinforce_config,
    reinforce_pp_config,
    remax_config,
    rloo_config,
)
from jaxrl_llm.losses.preference import (
    DPOConfig,
    ORPOConfig,
    RewardModelConfig,
    SimPOConfig,
    dpo_config,
    dpo_model_loss,
    orpo_config,
    orpo_model_loss,
    pair_denominator,
    preference_reference_logps,
    reward_model_config,
    reward_model_loss,
    simpo_config,
    simpo_model_loss,
)
from jaxrl_llm.losses.sft import SFTConfig, sft_config, sft_denominator, sft_loss
from jaxrl_llm.losses.surrogates import (
    CISPOConfig,
    GMPOConfig,
    SAPOConfig,
    cispo_config,
    cispo_model_loss,
    gmpo_config,
    gmpo_model_loss,
    sapo_config,
    sapo_model_loss,
    sequence_denominator,
    token_denominator,
    zero_advantage_batch,
)
from jaxrl_llm.losses.unpaired import (
    KTOConfig,
    PairwiseRankConfig,
    group_denominator,
    kto_config,
    kto_model_loss,
    kto_reference_logps,
    pairwise_rank_config,
    pairwise_rank_model_loss,
    row_denominator,
)

LossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


def policy_reference_logps(
    ref_params: Any,
    batch: Batch,
    *,
    apply_fn: ApplyFn,
    config: PolicyGradientConfig,
    logprobs: LogprobSettings = DEFAULT_LOGPROBS,
) -> dict[str, jax.Array]:
    """``{"ref_logp": [B, T]}``: the reference policy's per-token log-probs (same settings as
    the policy's: temperature, window, shared prompt)."""
    del config
    lp = sequence_logps(ref_params, batch, apply_fn=apply_fn, **logprobs.kwargs())
    return {"ref_logp": jax.lax.stop_gradient(lp)}


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """One loss: its function, denominator, config class and preset, and what it needs.

    Attributes:
      loss_fn: ``loss_fn(params, batch, *, apply_fn, config, logprobs) -> (scalar, metrics)``.
      denominator_fn: ``denominator_fn(batch, config) -> scalar``, the full-batch denominator
        to pass to every micro-batch as ``batch["loss_denominator"]``.
      config_cls: the frozen config dataclass (the paper's hyperparameters only).
      preset: ``preset(**overrides) -> config`` with the algorithm's paper defaults.
      reference_fn: ``reference_fn(ref_params, batch, *, apply_fn, config, logprobs) -> dict``
        of the batch entries a frozen reference model provides, or None when none is needed.
      uses_reference: ``uses_reference(config) -> bool``: whether this config needs the
        reference pass (e.g. GRPO only with β > 0, DPO unless reference-free).
      batch_kind: which batch layout the loss reads: ``sequence``, ``rl``, ``preference``,
        ``kto`` or ``rank`` (see the package docstring).
      zero_batch_fn: ``zero_batch_fn(config) -> is_zero or None``, where ``is_zero(batch)``
        is True only when the loss and its gradient on that batch are exactly 0 (the train
        step's ``skip_fn``); None (the field or its result) when no batch can be skipped.
      traced_hparams: the config's scalar fields the loss also takes traced
        (``hparams={name: value}``), so that a schedule of them does not recompile.
      rollout_corrections: the optional correction entries of the batch the loss reads:
        ``is_weights`` (TIS / MIS weights) and ``proximal_logp`` (decoupled PPO); what a
        run's ``rollout.correction`` may ask of it.
      batch_kind_of: ``batch_kind_of(config) -> str`` when the layout depends on the config
        (distillation: ``rl`` or ``distill``); None: always :attr:`batch_kind`.
      uses_teacher: ``uses_teacher(config) -> bool``: the loss runs a frozen teacher inside
        the step (``teacher=params`` and ``teacher_apply_fn``; GKD).
    """

    loss_fn: LossFn
    denominator_fn: Callable[..., jax.Array]
    config_cls: type
    preset: Callable[..., Any]
    reference_fn: Callable[..., dict[str, jax.Array]] | None = None
    uses_reference: Callable[[Any], bool] = lambda config: False
    batch_kind: str = "sequence"
    zero_batch_fn: Callable[[Any], Callable[[Batch], jax.Array] | None] | None = None
    traced_hparams: tuple[str, ...] = ()
    rollout_corrections: tuple[str, ...] = ()
    batch_kind_of: Callable[[Any], str] | None = None
    uses_teacher: Callable[[Any], bool] = lambda config: False

    def layout_kind(self, config: Any) -> str:
        """The batch layout ``config`` reads (:attr:`batch_kind_of` or :attr:`batch_kind`)."""
        return self.batch_kind if self.batch_kind_of is None else self.batch_kind_of(config)


def _pg(preset) -> LossSpec:
    return LossSpec(
        policy_gradient_loss,
        policy_gradient_denominator,
        PolicyGradientConfig,
        preset,
        policy_reference_logps,
        lambda c: c.kl_coef > 0,
        "rl",
        policy_gradient_zero_batch,
        TRACED_HPARAMS,
        rollout_corrections=("is_weights", "proximal_logp"),
    )


LOSSES: dict[str, LossSpec] = {
    "sft": LossSpec(sft_loss, sft_denominator, SFTConfig, sft_config),
    "reward_model": LossSpec(
        reward_model_loss,
        pair_denominator,
        RewardModelConfig,
        reward_model_config,
        batch_kind="preference",
    ),
    "ppo_actor": _pg(ppo_actor_config),
    "ppo_critic": LossSpec(
        ppo_critic_loss, critic_denominator, CriticConfig, ppo_critic_config, batch_kind="rl"
    ),
    "grpo": _pg(grpo_config),
    "dr_grpo": _pg(dr_grpo_config),
    "dapo": _pg(dapo_config),
    "gspo": _pg(gspo_config),
    "reinforce": _pg(reinforce_config),
    "reinforce_pp": _pg(reinforce_pp_config),
    "rloo": _pg(rloo_config),
    "remax": _pg(remax_config),
    "dpo": LossSpec(
        dpo_model_loss,
        pair_denominator,
        DPOConfig,
        dpo_config,
        preference_reference_logps,
        lambda c: not c.reference_free,
        "preference",
    ),
    "kto": LossSpec(
        kto_model_loss,
        row_denominator,
        KTOConfig,
        kto_config,
        kto_reference_logps,
        lambda c: True,
        "kto",
    ),
    "orpo": LossSpec(
        orpo_model_loss, pair_denominator, ORPOConfig, orpo_config, batch_kind="preference"
    ),
    "simpo": LossSpec(
        simpo_model_loss, pair_denominator, SimPOConfig, simpo_config, batch_kind="preference"
    ),
    "cispo": LossSpec(
        cispo_model_loss,
        token_denominator,
        CISPOConfig,
        cispo_config,
        batch_kind="rl",
        zero_batch_fn=zero_advantage_batch,
        rollout_corrections=("is_weights",),
    ),
    "sapo": LossSpec(
        sapo_model_loss,
        token_denominator,
        SAPOConfig,
        sapo_config,
        batch_kind="rl",
        zero_batch_fn=zero_advantage_batch,
        rollout_corrections=("is_weights",),
    ),
    "gmpo": LossSpec(
        gmpo_model_loss,
        sequence_denominator,
        GMPOConfig,
        gmpo_config,
        batch_kind="rl",
        zero_batch_fn=zero_advantage_batch,
    ),
    "pairwise_rank": LossSpec(
        pairwise_rank_model_loss,
        group_denominator,
        PairwiseRankConfig,
        pairwise_rank_config,
        batch_kind="rank",
    ),
    "distill": LossSpec(
        distill_loss,
        distill_denominator,
        DistillConfig,
        distill_config,
        batch_kind="rl",
        batch_kind_of=distill_batch_kind,
        uses_teacher=distill_uses_teacher,
    ),
}


def get_loss(name: str) -> LossSpec:
    """The :class:`LossSpec` of ``name``; :class:`ConfigError` listing the names otherwise."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ConfigError(
            f"unknown loss/algorithm {name!r}; available: {', '.join(sorted(LOSSES))}"
        ) from None
