"""The schema of ``jaxrl-llm train`` configs: one frozen dataclass per YAML section.

Every config has top-level ``seed``, ``output_dir``, ``max_steps`` and ``algorithm`` (a key of
:data:`jaxrl_llm.losses.ALGORITHMS`; what the checks below know of an algorithm comes from its
entry there, never from its name). The ``loss`` section holds only the paper's hyperparameters
and is validated against the loss's config dataclass, starting from the paper defaults (the
registry's ``preset``); ``schedules`` may move some of them during the run without a
recompile. How log-probs are computed is the ``logprobs`` section. Offline algorithms read
``data`` + ``train``; online ones read ``data`` (prompts) + ``rollout`` + ``rewards`` + ``eval``.

``resume``: ``true`` continues from the newest complete checkpoint in ``output_dir``;
``auto`` does so when there is one and starts fresh otherwise, so that one command serves a
first start and a supervisor's relaunch. ``distributed``: a multi-process job's settings.

Validation happens before anything compiles: unknown keys, wrong types and impossible
combinations are one-line :class:`~jaxrl_llm.errors.ConfigError`s naming the key.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from jaxrl_llm.errors import ConfigError, did_you_mean
from jaxrl_llm.losses.registry import ALGORITHMS, Algorithm
from jaxrl_llm.train.config.sections import (
    CheckpointSection,
    DataSection,
    DistillSection,
    DistributedSection,
    EnvSection,
    EvalSection,
    LoggingSection,
    LogprobSection,
    MeshSection,
    ModelSection,
    OptimSection,
    PPOSection,
    ProcessRewardSection,
    RewardItem,
    RolloutSection,
    ScheduleItem,
    TeacherSection,
    TrainSection,
)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole ``jaxrl-llm train`` config (see the module docstring)."""

    output_dir: str
    max_steps: int
    algorithm: str
    seed: int = 0
    resume: bool | Literal["auto"] = False
    max_nonfinite_steps: int = 3
    model: ModelSection = ModelSection()
    optim: OptimSection = OptimSection()
    mesh: MeshSection = MeshSection()
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection()
    distributed: DistributedSection = DistributedSection()
    data: DataSection = DataSection()
    loss: dict[str, Any] = dataclasses.field(default_factory=dict)
    schedules: tuple[ScheduleItem, ...] = ()
    logprobs: LogprobSection = LogprobSection()
    train: TrainSection = TrainSection()
    rollout: RolloutSection = RolloutSection()
    rewards: tuple[RewardItem, ...] = ()
    eval: EvalSection = EvalSection()
    ppo: PPOSection = PPOSection()
    process_reward: ProcessRewardSection | None = None
    env: EnvSection | None = None
    teacher: TeacherSection | None = None
    distill: DistillSection = DistillSection()

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"algorithm: unknown {self.algorithm!r}{did_you_mean(self.algorithm, ALGORITHMS)}"
                f"; allowed: {', '.join(ALGORITHMS)}"
            )
        algo = self.algo
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}")
        if not self.output_dir.strip():
            raise ConfigError("output_dir: a run directory is required, e.g. output_dir=runs/x")
        if self.max_nonfinite_steps < 1:
            raise ConfigError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        if not self.data.train:
            raise ConfigError("data.train: a training data file or directory is required")
        if self.model.source == "tiny" and self.model.tokenizer != "char":
            raise ConfigError(
                "model.source=tiny needs model.tokenizer=char (a random model has "
                "no tokenizer of its own)"
            )
        if not algo.lora and self.model.lora is not None:
            raise ConfigError(
                f"model.lora: {self.algorithm} does not support LoRA yet"
                + (
                    " (its critic is a value head on a full copy of the policy)"
                    if algo.critic
                    else ""
                )
            )
        _check_teacher(self)
        if self.is_online:
            _check_online(self)
        else:
            t = self.train
            if t.batch_size < 1 or t.micro_batches < 1 or t.batch_size % t.micro_batches:
                raise ConfigError(
                    f"train.micro_batches={t.micro_batches} must divide "
                    f"train.batch_size={t.batch_size} (both >= 1)"
                )
            if self.env is not None:
                raise ConfigError(
                    f"env: {self.algorithm} is an offline algorithm; environments are for "
                    f"online RL (grpo, ppo, ...)"
                )
            if self.rewards:
                raise ConfigError(
                    f"rewards: {self.algorithm} is an offline algorithm and uses "
                    f"no reward functions; remove the rewards section"
                )

    @property
    def algo(self) -> Algorithm:
        """The algorithm's registry entry (:data:`jaxrl_llm.losses.ALGORITHMS`)."""
        return ALGORITHMS[self.algorithm]

    @property
    def is_online(self) -> bool:
        """True for the online RL algorithms (rollout → reward → update)."""
        return self.algo.online


def _check_online(cfg: RunConfig) -> None:
    """An online run's rollout, rewards and correction against its algorithm's needs."""
    algo = cfg.algo
    r = cfg.rollout
    if r.group_size < algo.min_group_size:
        raise ConfigError(
            f"rollout.group_size={r.group_size}: {cfg.algorithm} needs "
            f"groups of at least {algo.min_group_size} samples per prompt"
        )
    if cfg.process_reward is not None and not algo.process_supervision:
        raise ConfigError(
            f"process_reward: process supervision is defined for the "
            f"GRPO family, not {cfg.algorithm}"
        )
    if cfg.env is not None:
        _check_env(cfg)
    if not cfg.rewards and cfg.env is None:
        raise ConfigError(
            "rewards: an online algorithm needs at least one reward "
            "function, e.g. rewards: [{name: math_answer}]"
        )
    for name in (
        "prompts_per_step",
        "group_size",
        "max_new_tokens",
        "epochs",
        "minibatches",
        "max_sampling_rounds",
        "micro_batch_groups",
    ):
        if getattr(r, name) < 1:
            raise ConfigError(f"rollout.{name} must be >= 1, got {getattr(r, name)}")
    n = r.prompts_per_step * r.group_size
    if n % r.minibatches:
        raise ConfigError(
            f"rollout.minibatches={r.minibatches} must divide the {n} rows of a rollout batch"
        )
    _check_sampling(r)
    if r.max_staleness < 0:
        raise ConfigError(
            f"rollout.max_staleness must be >= 0 (0 = synchronous), got {r.max_staleness}"
        )
    if r.devices < 0 or (r.tensor != "auto" and r.tensor < 1):
        raise ConfigError(
            f"rollout.devices must be >= 0 (0 = on the learner's devices) and "
            f"rollout.tensor >= 1 or auto, got {r.devices} and {r.tensor}"
        )
    if r.partial and (r.max_staleness < 1 or r.engine != "paged" or cfg.env):
        raise ConfigError(
            "rollout.partial: true continues generations with newer weights; it needs "
            "rollout.max_staleness >= 1 and rollout.engine: paged (single-turn: no env)"
        )
    if r.correction is not None:
        need = "proximal_logp" if r.correction.decoupled else "is_weights"
        if need not in algo.loss_spec().rollout_corrections:
            raise ConfigError(
                f"rollout.correction: {cfg.algorithm}'s loss ({algo.loss}) takes no "
                f"{need}; the clipped policy-gradient losses and PPO take both, CISPO "
                f"and SAPO the importance weights only (not decoupled: true)"
            )


def _check_teacher(cfg: RunConfig) -> None:
    """A teacher exactly when the algorithm scores with one (distillation), and what such a
    run cannot combine yet."""
    algo = cfg.algo
    if algo.teacher and cfg.teacher is None:
        raise ConfigError(
            f"teacher: {cfg.algorithm} needs a teacher model, e.g. teacher: {{source: runs/x/hf}}"
        )
    if not algo.teacher and cfg.teacher is not None:
        raise ConfigError(f"teacher: {cfg.algorithm} uses no teacher; remove the teacher section")
    if not algo.teacher:
        return
    if cfg.distill.reward_weight > 0 and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"distill.reward_weight={cfg.distill.reward_weight} normalises rewards over a "
            f"group: rollout.group_size must be >= 2, got {cfg.rollout.group_size}"
        )
    if cfg.mesh.context > 1:
        raise ConfigError(
            "mesh.context > 1: distillation does not run the teacher round the ring yet; "
            "use mesh.context: 1"
        )


def _check_env(cfg: RunConfig) -> None:
    """What a multi-turn run cannot combine (its episodes are sampled by the paged engine)."""
    algo, env = cfg.algo, cfg.env
    assert env is not None
    if not algo.rollout_logprobs:
        raise ConfigError(
            f"env: {cfg.algorithm} ({algo.family.value}) does not train on episodes; "
            f"environments work with the group policy-gradient algorithms, PPO and distillation"
        )
    if cfg.teacher is not None and cfg.teacher.system_prompt is not None:
        raise ConfigError(
            "env with teacher.system_prompt: context distillation re-encodes a single-turn "
            "prompt for the teacher; an episode's opening and turns have no such prompt"
        )
    if cfg.process_reward is not None:
        raise ConfigError("env: process supervision (process_reward) is single-turn only")
    t = env.max_turn_tokens
    if t is not None and t > cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"env.max_turn_tokens={t} exceeds rollout.max_new_tokens="
            f"{cfg.rollout.max_new_tokens} (the whole episode's budget)"
        )


#: The lowest ``rollout.temperature`` a run trains at. The loss divides the logits by the same
#: τ: below this the update's log-probs are so steep that a sampler/learner rounding difference
#: becomes a large importance ratio, and 1e-30 overflows to a NaN loss.
MIN_TEMPERATURE = 0.01


def _check_sampling(r: RolloutSection) -> None:
    """The rollout's sampling settings, named as config keys (what SamplingConfig allows)."""
    if not (r.temperature > 0 and math.isfinite(r.temperature)):
        raise ConfigError(f"rollout.temperature must be a finite number > 0, got {r.temperature}")
    if r.temperature < MIN_TEMPERATURE:
        raise ConfigError(
            f"rollout.temperature={r.temperature:g} is below {MIN_TEMPERATURE}: the loss divides "
            f"the logits by it, and its log-probs overflow; use at least {MIN_TEMPERATURE}"
        )
    if r.top_k < 0:
        raise ConfigError(f"rollout.top_k must be >= 0 (0 = off), got {r.top_k}")
    if not 0.0 < r.top_p <= 1.0:
        raise ConfigError(f"rollout.top_p must be in (0, 1] (1 = off), got {r.top_p}")
    if not 0.0 <= r.min_p < 1.0:
        raise ConfigError(f"rollout.min_p must be in [0, 1) (0 = off), got {r.min_p}")
