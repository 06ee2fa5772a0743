"""Algorithm facts in one place: two explicit dicts (no import side effects).

* :data:`LOSSES`: loss name -> :class:`LossSpec` (the loss, its denominator, its config class
  and paper preset, the reference pass it needs, the batches it may skip).
* :data:`ALGORITHMS`: algorithm name (a run config's ``algorithm:``) -> :class:`Algorithm`,
  what the trainers, the config checks and the memory estimator ask instead of comparing
  names: online or offline, the family (which learner strategy turns experience into
  batches), the advantage estimator, whether it needs groups, a critic, a reward model,
  pairs, a greedy baseline, and which rollout settings its loss reads.

The train step looks a loss up here::

    spec = LOSSES["grpo"]
    config = spec.preset(kl_coef=0.02)                # frozen dataclass, paper defaults
    den = spec.denominator_fn(full_batch, config)      # once per optimizer step
    loss, metrics = spec.loss_fn(params, {**micro, "loss_denominator": den},
                                 apply_fn=apply_fn, config=config, logprobs=settings)

Adding a group-policy-gradient algorithm that differs only in its per-token loss: one loss
function (in ``policy.py`` or its own module), one :data:`LOSSES` entry, one
:data:`ALGORITHMS` entry with ``family=AlgorithmFamily.GROUP_POLICY_GRADIENT``, and a config file.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import jax

from jaxrl_llm.errors import ConfigError, did_you_mean
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
    AdvantageEstimator,
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
    dpo_loss,
    orpo_config,
    orpo_loss,
    pair_denominator,
    preference_reference_logps,
    reward_model_config,
    reward_model_loss,
    simpo_config,
    simpo_loss,
)
from jaxrl_llm.losses.sft import SFTConfig, sft_config, sft_denominator, sft_loss
from jaxrl_llm.losses.surrogates import (
    CISPOConfig,
    GMPOConfig,
    SAPOConfig,
    cispo_config,
    cispo_loss,
    gmpo_config,
    gmpo_loss,
    sapo_config,
    sapo_loss,
    sequence_denominator,
    token_denominator,
    zero_advantage_batch,
)
from jaxrl_llm.losses.unpaired import (
    KTOConfig,
    PairwiseRankConfig,
    group_denominator,
    kto_config,
    kto_loss,
    kto_reference_logps,
    pairwise_rank_config,
    pairwise_rank_loss,
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
        dpo_loss,
        pair_denominator,
        DPOConfig,
        dpo_config,
        preference_reference_logps,
        lambda c: not c.reference_free,
        "preference",
    ),
    "kto": LossSpec(
        kto_loss, row_denominator, KTOConfig, kto_config, kto_reference_logps, lambda c: True, "kto"
    ),
    "orpo": LossSpec(orpo_loss, pair_denominator, ORPOConfig, orpo_config, batch_kind="preference"),
    "simpo": LossSpec(
        simpo_loss, pair_denominator, SimPOConfig, simpo_config, batch_kind="preference"
    ),
    "cispo": LossSpec(
        cispo_loss,
        token_denominator,
        CISPOConfig,
        cispo_config,
        batch_kind="rl",
        zero_batch_fn=zero_advantage_batch,
        rollout_corrections=("is_weights",),
    ),
    "sapo": LossSpec(
        sapo_loss,
        token_denominator,
        SAPOConfig,
        sapo_config,
        batch_kind="rl",
        zero_batch_fn=zero_advantage_batch,
        rollout_corrections=("is_weights",),
    ),
    "gmpo": LossSpec(
        gmpo_loss,
        sequence_denominator,
        GMPOConfig,
        gmpo_config,
        batch_kind="rl",
        zero_batch_fn=zero_advantage_batch,
    ),
    "pairwise_rank": LossSpec(
        pairwise_rank_loss,
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


class AlgorithmFamily(str, enum.Enum):
    """How an algorithm turns data into learner batches (the train layer has one strategy per
    family).

    ``offline``: a fixed data set, batches straight from the collator. ``group_policy_gradient``:
    G samples per prompt, rewards → per-sequence (or per-token) advantages, the clipped
    surrogate. ``ppo``: a critic, GAE on a KL-shaped reward. ``online_pairs``: the best and
    worst sample of each group as a DPO pair (online DPO). ``distillation``: a frozen teacher
    scores the student's samples (on-policy distillation; reverse-KL advantages or GKD).
    """

    OFFLINE = "offline"
    GROUP_POLICY_GRADIENT = "group_policy_gradient"
    PPO = "ppo"
    ONLINE_PAIRS = "online_pairs"
    DISTILLATION = "distillation"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Algorithm:
    """What the trainers, the config checks and the memory estimator know of an algorithm.

    Attributes:
      loss: the :data:`LOSSES` key its policy trains with.
      family: the :class:`AlgorithmFamily` (which learner strategy builds its batches).
      data_format: the ``jaxrl_llm.data.Format`` value of its training data (``prompt`` for
        the online algorithms).
      preset_overrides: fixed overrides of the loss preset (``ipo``: DPO with ``kind=ipo``).
      advantage: the :class:`~jaxrl_llm.losses.policy.AdvantageEstimator` it is defined with
        (group policy gradient; None otherwise).
      min_group_size: the least ``rollout.group_size`` it is defined for (2: group baselines
        and pairs need two samples of a prompt).
      critic: trains a value model beside the policy (PPO).
      trains_reward_head: the trained model is a reward model with a scalar head.
      scores_with_reward_model: its reward usually comes from a learned reward model (for the
        memory estimator's model count; a verifier works too).
      process_supervision: accepts a ``process_reward`` section (per-step rewards).
      lora: LoRA adapters are supported.
      sampling_settings: the rollout settings its loss reads: ``temperature`` (log-probs at
        the sampling τ), ``max_new_tokens`` (a loss ``max_len`` defaulting to the budget).
      teacher: a frozen teacher model scores the samples (the run's ``teacher`` section).
      sequences_per_example: forward passes per example (2 for chosen + rejected).
      data_note / reward_note: the source texts' columns (the memory table prints them).
    """

    loss: str
    family: AlgorithmFamily
    data_format: str
    preset_overrides: tuple[tuple[str, Any], ...] = ()
    advantage: AdvantageEstimator | None = None
    min_group_size: int = 1
    critic: bool = False
    trains_reward_head: bool = False
    scores_with_reward_model: bool = False
    process_supervision: bool = False
    lora: bool = True
    sampling_settings: tuple[str, ...] = ()
    teacher: bool = False
    sequences_per_example: int = 1
    data_note: str = ""
    reward_note: str = ""

    @property
    def online(self) -> bool:
        """True when it samples rollouts (rollout → reward → update)."""
        return self.family is not AlgorithmFamily.OFFLINE

    @property
    def rl_batches(self) -> bool:
        """True when its learner batch is the per-token ``rl`` layout built from episodes
        (the group policy-gradient family and PPO): it trains on multi-turn episodes, reads
        log-probs in the completion window at the sampling temperature, and packs its rows."""
        return self.family in (AlgorithmFamily.GROUP_POLICY_GRADIENT, AlgorithmFamily.PPO)

    @property
    def rollout_logprobs(self) -> bool:
        """True when its losses read log-probs of sampled completions: in the completion
        window, at the sampling temperature (:attr:`rl_batches` and distillation)."""
        return self.rl_batches or self.family is AlgorithmFamily.DISTILLATION

    @property
    def pairs_per_group(self) -> bool:
        """True when each prompt's group gives one preference pair (online DPO): one update
        per step over one pair per prompt."""
        return self.family is AlgorithmFamily.ONLINE_PAIRS

    @property
    def group_skipping(self) -> bool:
        """True when update micro-batches of groups whose advantages are all zero may be
        skipped (the group policy-gradient family; PPO's GAE advantages are never all 0)."""
        return self.family is AlgorithmFamily.GROUP_POLICY_GRADIENT

    @property
    def greedy_baseline(self) -> bool:
        """True when its baseline is the reward of a greedy completion (ReMax)."""
        return self.advantage is AdvantageEstimator.REMAX

    def loss_spec(self) -> LossSpec:
        """The :class:`LossSpec` of :attr:`loss`."""
        return LOSSES[self.loss]

    def preset(self, **overrides) -> Any:
        """The loss config with the paper's defaults, this entry's fixed overrides, then
        ``overrides``."""
        return self.loss_spec().preset(**{**dict(self.preset_overrides), **overrides})


def _group_pg(
    loss: str,
    advantage: AdvantageEstimator,
    *,
    groups: bool = True,
    process: bool = True,
    reward: str = "verifiable or RM",
) -> Algorithm:
    return Algorithm(
        loss=loss,
        family=AlgorithmFamily.GROUP_POLICY_GRADIENT,
        data_format="prompt",
        advantage=advantage,
        min_group_size=2 if groups else 1,
        process_supervision=process,
        sampling_settings=("temperature", "max_new_tokens"),
        data_note="online",
        reward_note=reward,
    )


def _offline(
    loss: str, fmt: str, data: str, reward: str, *, pairs: bool = False, **kw
) -> Algorithm:
    return Algorithm(
        loss=loss,
        family=AlgorithmFamily.OFFLINE,
        data_format=fmt,
        sequences_per_example=2 if pairs else 1,
        data_note=data,
        reward_note=reward,
        **kw,
    )


_A = AdvantageEstimator
ALGORITHMS: dict[str, Algorithm] = {
    "sft": _offline("sft", "sft", "demonstrations", "none"),
    "reward_model": _offline(
        "reward_model",
        "preference",
        "offline pairs",
        "learned (trained here)",
        pairs=True,
        trains_reward_head=True,
    ),
    "dpo": _offline("dpo", "preference", "offline pairs", "implicit", pairs=True),
    "ipo": _offline(
        "dpo",
        "preference",
        "offline pairs",
        "implicit",
        pairs=True,
        preset_overrides=(("kind", "ipo"),),
    ),
    "kto": _offline("kto", "kto", "offline binary labels", "implicit", pairs=True),
    "orpo": _offline("orpo", "preference", "offline pairs", "implicit (odds ratio)", pairs=True),
    "simpo": _offline(
        "simpo", "preference", "offline pairs", "implicit (length-normalised)", pairs=True
    ),
    "pairwise_rank": _offline("pairwise_rank", "pairwise_rank", "offline ranked groups", "scores"),
    "ppo": Algorithm(
        loss="ppo_actor",
        family=AlgorithmFamily.PPO,
        data_format="prompt",
        advantage=_A.GAE,
        critic=True,
        scores_with_reward_model=True,
        lora=False,
        sampling_settings=("temperature", "max_new_tokens"),
        data_note="online",
        reward_note="learned RM",
    ),
    "grpo": _group_pg("grpo", _A.GRPO, reward="verifiable"),
    "dr_grpo": _group_pg("dr_grpo", _A.GRPO_NO_STD, reward="verifiable"),
    "dapo": _group_pg("dapo", _A.GRPO, reward="verifiable (no KL term)"),
    "gspo": _group_pg("gspo", _A.GRPO, reward="verifiable"),
    "reinforce": _group_pg("reinforce", _A.REWARD, groups=False, process=False),
    "reinforce_pp": _group_pg("reinforce_pp", _A.REINFORCE_PP, process=False),
    "rloo": _group_pg("rloo", _A.RLOO, process=False),
    "remax": _group_pg("remax", _A.REMAX, groups=False, process=False),
    # 2025-26 surrogates: the GRPO data path (group advantages) with another per-token loss
    "cispo": _group_pg("cispo", _A.GRPO, reward="verifiable"),
    "sapo": _group_pg("sapo", _A.GRPO, reward="verifiable"),
    "gmpo": _group_pg("gmpo", _A.GRPO, reward="verifiable"),
    "online_dpo": Algorithm(
        loss="dpo",
        family=AlgorithmFamily.ONLINE_PAIRS,
        data_format="prompt",
        min_group_size=2,
        scores_with_reward_model=True,
        sequences_per_example=2,
        data_note="online pairs",
        reward_note="RM or verifier",
    ),
    "distill": Algorithm(
        loss="distill",
        family=AlgorithmFamily.DISTILLATION,
        data_format="prompt",
        sampling_settings=("temperature", "max_new_tokens"),
        teacher=True,
        data_note="online (student samples)",
        reward_note="teacher log-probs (+ optional verifier)",
    ),
}


def get_algorithm(name: str) -> Algorithm:
    """The :class:`Algorithm` entry of ``name``; :class:`ConfigError` listing the names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigError(
            f"algorithm: unknown {name!r}{did_you_mean(name, ALGORITHMS)}; allowed: "
            f"{', '.join(ALGORITHMS)}"
        ) from None
