"""The algorithm table: loss name -> :class:`LossSpec`, one explicit dict (no import side effects).

The train step looks an algorithm up here::

    spec = LOSSES["grpo"]
    config = spec.preset(kl_coef=0.02)                # frozen dataclass, paper defaults
    den = spec.denominator_fn(full_batch, config)      # once per optimizer step
    loss, metrics = spec.loss_fn(params, {**micro, "loss_denominator": den},
                                 apply_fn=apply_fn, config=config)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses.common import ApplyFn
from jaxrl_llm.losses.common import Batch
from jaxrl_llm.losses.common import sequence_logps
from jaxrl_llm.losses.policy import CriticConfig
from jaxrl_llm.losses.policy import PolicyGradientConfig
from jaxrl_llm.losses.policy import critic_denominator
from jaxrl_llm.losses.policy import dapo_config
from jaxrl_llm.losses.policy import dr_grpo_config
from jaxrl_llm.losses.policy import grpo_config
from jaxrl_llm.losses.policy import gspo_config
from jaxrl_llm.losses.policy import policy_gradient_denominator
from jaxrl_llm.losses.policy import policy_gradient_loss
from jaxrl_llm.losses.policy import policy_gradient_zero_batch
from jaxrl_llm.losses.policy import ppo_actor_config
from jaxrl_llm.losses.policy import ppo_critic_config
from jaxrl_llm.losses.policy import ppo_critic_loss
from jaxrl_llm.losses.policy import reinforce_config
from jaxrl_llm.losses.policy import reinforce_pp_config
from jaxrl_llm.losses.policy import remax_config
from jaxrl_llm.losses.policy import rloo_config
from jaxrl_llm.losses.preference import DPOConfig
from jaxrl_llm.losses.preference import ORPOConfig
from jaxrl_llm.losses.preference import RewardModelConfig
from jaxrl_llm.losses.preference import SimPOConfig
from jaxrl_llm.losses.preference import dpo_config
from jaxrl_llm.losses.preference import dpo_loss
from jaxrl_llm.losses.preference import orpo_config
from jaxrl_llm.losses.preference import orpo_loss
from jaxrl_llm.losses.preference import pair_denominator
from jaxrl_llm.losses.preference import preference_reference_logps
from jaxrl_llm.losses.preference import reward_model_config
from jaxrl_llm.losses.preference import reward_model_loss
from jaxrl_llm.losses.preference import simpo_config
from jaxrl_llm.losses.preference import simpo_loss
from jaxrl_llm.losses.sft import SFTConfig
from jaxrl_llm.losses.sft import sft_config
from jaxrl_llm.losses.sft import sft_denominator
from jaxrl_llm.losses.sft import sft_loss
from jaxrl_llm.losses.unpaired import KTOConfig
from jaxrl_llm.losses.unpaired import PairwiseRankConfig
from jaxrl_llm.losses.unpaired import group_denominator
from jaxrl_llm.losses.unpaired import kto_config
from jaxrl_llm.losses.unpaired import kto_loss
from jaxrl_llm.losses.unpaired import kto_reference_logps
from jaxrl_llm.losses.unpaired import pairwise_rank_config
from jaxrl_llm.losses.unpaired import pairwise_rank_loss
from jaxrl_llm.losses.unpaired import row_denominator

LossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]


def policy_reference_logps(
    ref_params: Any, batch: Batch, *, apply_fn: ApplyFn, config: PolicyGradientConfig
) -> dict[str, jax.Array]:
    """``{"ref_logp": [B, T]}``: the reference policy's per-token log-probs (same temperature)."""
    lp = sequence_logps(ref_params, batch, apply_fn=apply_fn, temperature=config.temperature,
                        chunk_size=config.chunk_size, window=config.logprob_window,
                        prompt_group_size=config.prompt_group_size)
    return {"ref_logp": jax.lax.stop_gradient(lp)}


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """One algorithm: its loss, denominator, config class and preset.

    Attributes:
      loss_fn: ``loss_fn(params, batch, *, apply_fn, config) -> (scalar, metrics)``.
      denominator_fn: ``denominator_fn(batch, config) -> scalar``, the full-batch denominator
        to pass to every micro-batch as ``batch["loss_denominator"]``.
      config_cls: the frozen config dataclass.
      preset: ``preset(**overrides) -> config`` with the algorithm's paper defaults.
      reference_fn: ``reference_fn(ref_params, batch, *, apply_fn, config) -> dict`` of the
        batch entries a frozen reference model provides, or None when none is needed.
      batch_kind: which batch layout the loss reads: ``sequence``, ``rl``, ``preference``,
        ``kto`` or ``rank`` (see the package docstring).
      zero_batch_fn: ``zero_batch_fn(config) -> is_zero or None``, where ``is_zero(batch)``
        is True only when the loss and its gradient on that batch are exactly 0 (the train
        step's ``skip_fn``); None (the field or its result) when no batch can be skipped.
    """

    loss_fn: LossFn
    denominator_fn: Callable[[Batch, Any], jax.Array]
    config_cls: type
    preset: Callable[..., Any]
    reference_fn: Callable[..., dict[str, jax.Array]] | None = None
    batch_kind: str = "sequence"
    zero_batch_fn: Callable[[Any], Callable[[Batch], jax.Array] | None] | None = None


def _pg(preset) -> LossSpec:
    return LossSpec(policy_gradient_loss, policy_gradient_denominator, PolicyGradientConfig,
                    preset, policy_reference_logps, "rl", policy_gradient_zero_batch)


LOSSES: dict[str, LossSpec] = {
    "sft": LossSpec(sft_loss, sft_denominator, SFTConfig, sft_config, None, "sequence"),
    "reward_model": LossSpec(reward_model_loss, pair_denominator, RewardModelConfig,
                             reward_model_config, None, "preference"),
    "ppo_actor": _pg(ppo_actor_config),
    "ppo_critic": LossSpec(ppo_critic_loss, critic_denominator, CriticConfig,
                           ppo_critic_config, None, "rl"),
    "grpo": _pg(grpo_config),
    "dr_grpo": _pg(dr_grpo_config),
    "dapo": _pg(dapo_config),
    "gspo": _pg(gspo_config),
    "reinforce": _pg(reinforce_config),
    "reinforce_pp": _pg(reinforce_pp_config),
    "rloo": _pg(rloo_config),
    "remax": _pg(remax_config),
    "dpo": LossSpec(dpo_loss, pair_denominator, DPOConfig, dpo_config,
                    preference_reference_logps, "preference"),
    "kto": LossSpec(kto_loss, row_denominator, KTOConfig, kto_config, kto_reference_logps,
                    "kto"),
    "orpo": LossSpec(orpo_loss, pair_denominator, ORPOConfig, orpo_config, None, "preference"),
    "simpo": LossSpec(simpo_loss, pair_denominator, SimPOConfig, simpo_config, None,
                      "preference"),
    "pairwise_rank": LossSpec(pairwise_rank_loss, group_denominator, PairwiseRankConfig,
                              pairwise_rank_config, None, "rank"),
}


def get_loss(name: str) -> LossSpec:
    """The :class:`LossSpec` of ``name``; :class:`ConfigError` listing the names otherwise."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ConfigError(f"unknown loss/algorithm {name!r}; available: "
                          f"{', '.join(sorted(LOSSES))}") from None
