"""Algorithm facts in one place: two explicit dicts (no import side effects).

* :data:`LOSSES` (:mod:`jaxrl_llm.losses.loss_specs`): loss name -> :class:`LossSpec` (the
  loss, its denominator, its config class and paper preset, the reference pass it needs, the
  batches it may skip).
* :data:`ALGORITHMS` (here): algorithm name (a run config's ``algorithm:``) ->
  :class:`Algorithm`, what the trainers, the config checks and the memory estimator ask
  instead of comparing names: online or offline, the family (which learner strategy turns
  experience into batches), the advantage estimator, whether it needs groups, a critic, a
  reward model, pairs, a greedy baseline, and which rollout settings its loss reads.

Adding a group-policy-gradient algorithm that differs only in its per-token loss: one loss
function (in ``policy.py`` or its own module), one :data:`LOSSES` entry, one
:data:`ALGORITHMS` entry with ``family=AlgorithmFamily.GROUP_POLICY_GRADIENT``, and a config file.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.losses.loss_specs import LOSSES, LossSpec
from jaxrl_llm.losses.policy import AdvantageEstimator


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
