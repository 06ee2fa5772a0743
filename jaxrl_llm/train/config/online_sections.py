"""The sections of a ``jaxrl-llm train`` config that an online run reads: the rollout (and its
correction), PPO's critic, the reward functions and process reward, a multi-turn environment,
a distillation teacher. One frozen dataclass each, validating its own fields; the other sections
and the re-export of these names are in :mod:`jaxrl_llm.train.config.sections`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from jaxrl_llm.errors import ConfigError, check_at_least
from jaxrl_llm.rewards.base import DEFAULT_TIMEOUT_S


@dataclasses.dataclass(frozen=True)
class CorrectionSection:
    """``rollout.correction``: correct the update for the sampler's log-probs (module
    docstring); absent or null = off (no extra forward).

    Attributes:
      level: ``token`` (a weight per token) or ``sequence`` (exp of the row's summed
        log-ratio, for every token of the row).
      mode: ``truncate`` (clip the weight to [low, high], TIS) or ``mask`` (weight 0 outside,
        MIS / IcePop).
      low, high: the bounds (null: that side unbounded); TIS's cap is 2.
      decoupled: decoupled PPO instead (the weights' bounds then only set the
        ``outside_frac`` metric).
    """

    level: Literal["token", "sequence"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"
    low: float | None = None
    high: float | None = 2.0
    decoupled: bool = False

    def __post_init__(self):
        if self.low is not None and self.low < 0:
            raise ConfigError(f"rollout.correction.low={self.low} must be >= 0 or null")
        if self.high is not None and self.high <= 0:
            raise ConfigError(f"rollout.correction.high={self.high} must be > 0 or null")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ConfigError(f"rollout.correction.low={self.low} must be <= high={self.high}")


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """Online RL: how completions are sampled and turned into updates.

    Attributes:
      prompts_per_step: B prompts per step; group_size: G samples each (N = B·G rows).
      max_new_tokens, temperature, top_k, top_p, min_p: sampling (the loss uses the same τ).
      epochs: K passes over the rollout batch; minibatches: optimizer steps per pass.
      dynamic_sampling: DAPO's filter: keep drawing prompts until the batch holds
        ``prompts_per_step`` groups whose rewards are not all equal (at most
        ``max_sampling_rounds`` rollouts per step; what is missing is reported).
      mask_truncated: truncated completions get zero loss weight (DAPO). (DAPO's soft
        overlong punishment is the ``overlong`` reward: ``rewards: [{name: overlong,
        kwargs: {buffer: L_cache}}]``, its weight the penalty factor.)
      advantage_scale: GRPO's std scaling: group | batch | none.
      skip_zero_advantage: the update skips the forward and backward of groups whose
        advantages are all zero (every reward of the group equal): each minibatch is split into
        micro-batches of ``micro_batch_groups`` groups, informative groups first, and a
        micro-batch with no nonzero advantage is not computed. Exact (same update: the loss's
        denominator, tokens or rows by aggregation, stays the whole minibatch's); it applies to
        the policy-gradient algorithms other than PPO with group_size ≥ 2 when the loss has no
        β·KL and no entropy term, and is ignored otherwise.
      micro_batch_groups: groups per update micro-batch when skipping, rounded up to a
        divisor of the minibatch's groups whose rows split over the mesh's batch shards;
        smaller skips more finely, larger runs fewer, bigger matmuls.
      correction: correct the update for the sampler's log-probs (TIS / MIS or decoupled
        PPO; one extra forward per step): :class:`~jaxrl_llm.train.online.correction.
        CorrectionSection`; null = off.
      max_staleness: k: rollouts run ahead of the learner in a background thread, trained on
        at most k steps after the weights that sampled them (0: synchronous, today's loop).
      staleness: ``wait`` (the producer never runs far enough ahead to exceed k) or ``drop``
        (it runs one batch further; too-old batches are dropped). See train/online/producer.py.
      engine: ``static`` (one batch; every row waits for the longest; the default) or
        ``paged`` (continuous batching over a paged KV cache, :mod:`jaxrl_llm.sampling.engine`);
        the same tokens for the same seed.
      dtype: weights and KV cache dtype while sampling (null = ``bfloat16`` on TPU and GPU,
        the model's own on CPU; ``bfloat16`` halves them); logits, the sampling softmax and
        the log-probs stay float32.
      devices: 0 = rollouts sample on the learner's devices, in turn with the update
        (colocated); n = the last n devices sample and the learner's mesh (``mesh``) spans the
        rest. Either way the sampler decodes on a copy of the weights in its own layout, made
        once per update (:mod:`jaxrl_llm.parallel.placement`).
      tensor: the sampler's tensor-parallel degree: heads, MLP columns, vocabulary and the KV
        cache's KV heads split over that many devices of one process, whole replicas over the
        rest (it divides a process's sampler devices); ``auto`` (the default) picks it from a
        model of the decode step on the run's chips (1 on CPU) and the run prints why.
      partial: with ``max_staleness`` ≥ 1 and the paged engine: a generation in flight when
        the learner publishes new weights continues with them from the next chunk (its
        tokens keep the versions that drew them; a row's staleness is its oldest token's)
        instead of finishing on the old ones (:meth:`jaxrl_llm.sampling.PagedEngine.swap`).
      routing_replay: a mixture of experts: the samplers record every token's top-k experts
        per layer and the update's forwards of the policy route each token to those instead
        of their own top-k, the gate weights still the router's probabilities at them
        (rollout routing replay, R3: Ma et al. 2025, https://arxiv.org/abs/2510.11370).
        Logs ``routing/mismatch_frac`` (0 with replay) and ``routing/own_topk_mismatch_frac``.
        Single-turn and multi-turn (``env``: the opening, the policy's turns and the
        environment's replies) rollouts; GRPO-family ``rl`` batches and online DPO's pairs
        (not packed pairs).
      record_routing: record the samplers' routing and log those metrics without replaying
        it (implied by ``routing_replay``).
    """

    prompts_per_step: int = 4
    group_size: int = 8
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    epochs: int = 1
    minibatches: int = 1
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 4
    mask_truncated: bool = False
    advantage_scale: Literal["group", "batch", "none"] = "group"
    skip_zero_advantage: bool = True
    micro_batch_groups: int = 1
    correction: CorrectionSection | None = None
    max_staleness: int = 0
    staleness: Literal["wait", "drop"] = "wait"
    engine: Literal["static", "paged"] = "static"
    dtype: Literal["float32", "bfloat16"] | None = None
    devices: int = 0
    tensor: int | Literal["auto"] = "auto"
    partial: bool = False
    routing_replay: bool = False
    record_routing: bool = False

    @property
    def records_routing(self) -> bool:
        """The samplers record each token's experts (``routing_replay`` or
        ``record_routing``)."""
        return self.routing_replay or self.record_routing


@dataclasses.dataclass(frozen=True)
class PPOSection:
    """PPO's critic and reward shaping (RLHF-PPO: Ziegler et al. 2019, Ouyang et al. 2022).

    Attributes:
      kl_coef: β of the per-token KL penalty in the reward (r_t = −β·KL_t, + score at the end).
      kl_kind: KL estimator of the shaping (k1 as TRL / OpenRLHF / verl).
      gamma, lam: GAE's discount and λ (Schulman et al. 2016; 1.0 and 0.95 are RLHF defaults).
      whiten_advantages: whiten GAE advantages over the batch's valid tokens.
      critic_lr: learning rate of the critic (a value head on a copy of the policy).
      value_clip: PPO2 value clipping ε_v (null = off).
    """

    kl_coef: float = 0.05
    kl_kind: Literal["k1", "k2", "k3", "abs"] = "k1"
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    critic_lr: float = 1e-5
    value_clip: float | None = 0.2

    def __post_init__(self):
        if not self.kl_coef >= 0:
            raise ConfigError(f"ppo.kl_coef must be >= 0, got {self.kl_coef}")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"ppo.{name} must be in [0, 1], got {getattr(self, name)}")
        if not (self.critic_lr > 0 and math.isfinite(self.critic_lr)):
            raise ConfigError(f"ppo.critic_lr must be a finite number > 0, got {self.critic_lr}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ConfigError(f"ppo.value_clip must be > 0 (or null: off), got {self.value_clip}")


@dataclasses.dataclass(frozen=True)
class RewardItem:
    """One reward function by name (``jaxrl_llm.rewards.REWARD_FUNCTIONS`` or
    ``package.module:function``), its weight and keyword arguments; ``timeout_s`` bounds one
    call (a call past it scores its rows invalid; null = no limit) and ``on_error`` says what a
    raising / hanging / exiting function does: ``invalid`` (those rows score 0, counted under
    ``rewards/<name>/errors`` and ``/timeouts``) or ``raise`` (the run saves and stops with one
    line). See :mod:`jaxrl_llm.rewards.user_code`."""

    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    on_error: Literal["invalid", "raise"] = "invalid"

    def __post_init__(self):
        if self.timeout_s is not None and not (
            math.isfinite(self.timeout_s) and self.timeout_s > 0
        ):
            raise ConfigError(
                f"rewards[].timeout_s: a number of seconds > 0 (or null: no limit), got "
                f"{self.timeout_s}"
            )


@dataclasses.dataclass(frozen=True)
class ProcessRewardSection:
    """GRPO with process supervision (DeepSeekMath §4.1.3): per-step rewards.

    Attributes:
      name: ``package.module:function``, a step scorer ``fn(prompt, steps, **fields) ->
        list[float]`` (one score per step), or ``outcome_as_process`` to score every prefix of
        the completion with the first outcome reward ("is the answer there yet?").
      delimiter: regex that separates steps (default: newlines).
      kwargs: bound to an imported scorer.
    """

    name: str = "outcome_as_process"
    delimiter: str = r"\n+"
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EnvSection:
    """A multi-turn environment (:mod:`jaxrl_llm.envs`): the policy acts over several turns and
    the environment answers each one.

    Attributes:
      name: a built-in (``jaxrl_llm.envs.ENVIRONMENTS``: ``single_turn``, ``tools``,
        ``guess_number``) or ``package.module:Class``; one instance per episode.
      kwargs: keyword arguments of the class.
      max_turns: policy turns per episode at most (then the episode ends).
      max_turn_tokens: tokens one policy turn may generate (null = ``rollout.max_new_tokens``,
        the budget of the whole episode's completion side, policy and environment tokens).
      workers: threads that run environment calls while the engine keeps decoding.
      check: build one environment at start-up and call ``reset`` on the first training row
        and ``step("")`` once, so a broken environment fails before anything compiles.
      max_failures: an environment that raises marks its episode invalid; this many
        consecutive steps in which every episode failed stop the run.
      step_timeout_s: seconds one ``reset`` / ``step`` call may take (null = no limit); a
        call past it fails its episode (``env/timeouts``). Tools have their own bound inside
        ``step`` (the ``tools`` environment's ``tool_timeout_s``).
    """

    name: str = "single_turn"
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_turns: int = 4
    max_turn_tokens: int | None = None
    workers: int = 8
    check: bool = True
    max_failures: int = 3
    step_timeout_s: float | None = 60.0

    def __post_init__(self):
        if self.step_timeout_s is not None and not (
            math.isfinite(self.step_timeout_s) and self.step_timeout_s > 0
        ):
            raise ConfigError(
                f"env.step_timeout_s: a number of seconds > 0 (or null: no limit), got "
                f"{self.step_timeout_s}"
            )
        check_at_least("env.max_turns", self.max_turns, 1)
        check_at_least(
            "env.max_turn_tokens", self.max_turn_tokens, 1, "or null: rollout.max_new_tokens"
        )
        check_at_least("env.workers", self.workers, 1)
        check_at_least("env.max_failures", self.max_failures, 1)
        if not self.name.strip():
            raise ConfigError("env.name: a built-in environment name or package.module:Class")


@dataclasses.dataclass(frozen=True)
class TeacherSection:
    """The frozen teacher of on-policy distillation (``algorithm: distill``).

    Attributes:
      source: anything ``model.source`` accepts (HF directory, .gguf file, PEFT adapter
        directory: merged onto its base, hub id, alias, ``tiny``), or a jaxrl_llm run
        directory (its ``hf/`` export, else its newest checkpoint) or checkpoint directory.
      tokenizer: ``auto`` (the source's) or ``char`` (the byte-level test tokenizer). The
        teacher's tokenizer must be the student's: it scores the student's token ids.
      tiny: ``ModelConfig.tiny`` overrides when ``source: tiny`` (a random model, for tests;
        initialised from the run's seed, so a tiny teacher with the student's settings is the
        student's initial weights).
      dtype: the teacher's weights and compute dtype (``float32`` or ``bfloat16``).
      system_prompt: privileged context only the teacher sees (context distillation): the
        teacher scores the same completion tokens after its own prompt, a system message
        before a conversational prompt or this text and a blank line before a plain one.
    """

    source: str = ""
    tokenizer: Literal["auto", "char"] = "auto"
    tiny: dict[str, Any] | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"
    system_prompt: str | None = None

    def __post_init__(self):
        if not self.source.strip():
            raise ConfigError("teacher.source: the teacher model is required, e.g. runs/x/hf")
        if self.source == "tiny" and self.tokenizer != "char":
            raise ConfigError("teacher.source=tiny needs teacher.tokenizer=char")
        if self.system_prompt is not None and not self.system_prompt.strip():
            raise ConfigError("teacher.system_prompt: empty; leave it out for no context")


@dataclasses.dataclass(frozen=True)
class DistillSection:
    """How on-policy distillation (``algorithm: distill``) mixes in the task rewards.

    Attributes:
      reward_weight: w ≥ 0 of the task rewards' group-normalised advantages (GRPO's
        (r − mean_group) / std_group) added to the distillation signal: per token
        ``A_t = log π_T(y_t) − log π_S(y_t) + w·Â`` (``loss.kind: reverse_kl``) or the
        surrogate on ``w·Â`` beside the JSD (``gkd``). 0 (default) = pure distillation; w > 0
        needs ``rollout.group_size >= 2``.
    """

    reward_weight: float = 0.0

    def __post_init__(self):
        if not (self.reward_weight >= 0 and math.isfinite(self.reward_weight)):
            raise ConfigError(
                f"distill.reward_weight must be a finite number >= 0, got {self.reward_weight}"
            )
