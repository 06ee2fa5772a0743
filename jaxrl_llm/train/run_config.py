"""The schema of ``jaxrl-llm train`` configs: one frozen dataclass per YAML section.

Every config has top-level ``seed``, ``output_dir``, ``max_steps`` and ``algorithm`` (a name in
:data:`jaxrl_llm.losses.LOSSES`, or ``ppo`` / ``online_dpo``). The ``loss`` section holds the
algorithm's own hyperparameters and is validated against its config dataclass, starting from the
algorithm's paper defaults (the registry's ``preset``). Offline algorithms read ``data`` +
``train``; online ones read ``data`` (prompts) + ``rollout`` + ``rewards`` + ``eval``.

Validation happens before anything compiles: unknown keys, wrong types and impossible
combinations are one-line :class:`~jaxrl_llm.errors.ConfigError`s naming the key.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from jaxrl_llm.errors import ConfigError

ONLINE_ALGORITHMS = ("ppo", "grpo", "dr_grpo", "dapo", "gspo", "reinforce", "reinforce_pp",
                     "rloo", "remax", "online_dpo")
OFFLINE_ALGORITHMS = ("sft", "reward_model", "dpo", "kto", "orpo", "simpo", "pairwise_rank")

# Data format each offline algorithm reads (jaxrl_llm.data.Format values).
OFFLINE_FORMATS = {"sft": "sft", "reward_model": "preference", "dpo": "preference",
                   "kto": "kto", "orpo": "preference", "simpo": "preference",
                   "pairwise_rank": "pairwise_rank"}

def _at_least(key: str, value, lo, note: str = "") -> None:
    """ConfigError ``"<key> must be >= <lo> (<note>), got <value>"`` when ``value < lo``;
    None passes (an optional setting left unset)."""
    if value is not None and value < lo:
        raise ConfigError(f"{key} must be >= {lo}{f' ({note})' if note else ''}, got {value}")


@dataclasses.dataclass(frozen=True)
class LoRASection:
    """LoRA adapters (``jaxrl_llm.models.lora``): rank, alpha, target projections."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                "down_proj")

    def __post_init__(self):
        from jaxrl_llm.models.lora import ALL_TARGETS

        if self.rank < 1:
            raise ConfigError(f"model.lora.rank must be >= 1, got {self.rank} (for full "
                              f"fine-tuning set model.lora=null)")
        if not self.alpha > 0:
            raise ConfigError(f"model.lora.alpha must be > 0, got {self.alpha}")
        unknown = [t for t in self.targets if t not in ALL_TARGETS]
        if unknown or not self.targets:
            raise ConfigError(f"model.lora.targets: unknown {unknown or 'empty list'}; allowed: "
                              f"{list(ALL_TARGETS)}")


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """Which model to train and how to run it.

    Attributes:
      source: HF directory, .gguf file, ``smollm2-135m-instruct``, or ``tiny`` (random init,
        for tests; ``tiny`` holds ModelConfig.tiny overrides and ``tokenizer`` must be ``char``).
      tokenizer: ``auto`` (from the source) or ``char`` (byte-level test tokenizer).
      param_dtype / compute_dtype: ``float32`` or ``bfloat16`` (master weights stay float32).
      remat: rematerialisation per layer: none | dots | full.
      lora: LoRA adapters instead of full fine-tuning (null = full fine-tuning).
      freeze_embeddings: keep the (tied) embedding matrix frozen during full fine-tuning.
    """

    source: str = "smollm2-135m-instruct"
    tokenizer: Literal["auto", "char"] = "auto"
    tiny: dict[str, Any] | None = None
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    remat: Literal["none", "dots", "full"] = "none"
    lora: LoRASection | None = None
    freeze_embeddings: bool = False


@dataclasses.dataclass(frozen=True)
class OptimSection:
    """Optimizer (optax): AdamW by default, with a learning-rate schedule and clipping."""

    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = 1e-5
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip: float | None = 1.0

    def __post_init__(self):
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"optim.lr must be a finite number > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            raise ConfigError(f"optim.eps must be > 0, got {self.eps}")
        if not self.weight_decay >= 0:
            raise ConfigError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ConfigError(f"optim.grad_clip must be > 0 (or null: no clipping), got "
                              f"{self.grad_clip}")


@dataclasses.dataclass(frozen=True)
class MeshSection:
    """Mesh axis sizes; -1 = all remaining devices."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for name, size in sizes.items():
            if size == 0 or size < -1:
                raise ConfigError(f"mesh.{name}={size} is invalid; use a positive size or -1 "
                                  f"(all remaining devices)")
        if sum(size == -1 for size in sizes.values()) > 1:
            raise ConfigError(f"mesh: only one of data/fsdp/tensor may be -1, got {sizes}")


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    """Where metrics go: metrics.jsonl always; TensorBoard and W&B optional."""

    log_every: int = 1
    tensorboard: bool = True
    wandb_project: str | None = None
    plots: bool = True

    def __post_init__(self):
        _at_least("logging.log_every", self.log_every, 1)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    """Orbax checkpoints under ``output_dir/checkpoints``; 0 = only at the end."""

    save_every: int = 0
    keep: int = 2
    export_hf: bool = False

    def __post_init__(self):
        _at_least("checkpoint.save_every", self.save_every, 0, "0 = only at the end")
        _at_least("checkpoint.keep", self.keep, 1)


@dataclasses.dataclass(frozen=True)
class DataSection:
    """The data set(s): local JSONL / Parquet / saved HF datasets (no downloads)."""

    train: str = ""
    eval: str | None = None
    max_length: int = 512
    length_policy: Literal["error", "truncate", "drop"] = "truncate"
    packing: bool = False
    shuffle: bool = True

    def __post_init__(self):
        if self.max_length < 2:
            raise ConfigError(f"data.max_length must be >= 2 tokens (a prompt token and a "
                              f"completion token), got {self.max_length}")


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """Offline training loop options."""

    batch_size: int = 8
    micro_batches: int = 1
    eval_every: int = 0
    eval_batches: int | None = None
    reference: Literal["on_the_fly", "precompute"] = "on_the_fly"

    def __post_init__(self):
        _at_least("train.eval_every", self.eval_every, 0, "0 = only before and after training")
        _at_least("train.eval_batches", self.eval_batches, 1, "or null: all")


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
      mask_truncated: truncated completions get zero loss weight (DAPO).
      overlong_buffer: DAPO soft overlong punishment buffer L_cache in tokens (null = off),
        against ``max_new_tokens``; overlong_penalty_factor scales it.
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
    overlong_buffer: int | None = None
    overlong_penalty_factor: float = 1.0
    advantage_scale: Literal["group", "batch", "none"] = "group"
    skip_zero_advantage: bool = True
    micro_batch_groups: int = 1


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
            raise ConfigError(f"ppo.critic_lr must be a finite number > 0, got "
                              f"{self.critic_lr}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ConfigError(f"ppo.value_clip must be > 0 (or null: off), got "
                              f"{self.value_clip}")


@dataclasses.dataclass(frozen=True)
class RewardItem:
    """One reward function by name (see ``jaxrl_llm.train.online.REWARD_FUNCTIONS``)."""

    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


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
class EvalSection:
    """Held-out evaluation of an online run: greedy decoding, mean of the first reward.

    Attributes:
      every: evaluate every N steps (0 = only before and after training).
      num_examples: how many held-out prompts (null = all).
      batch_size: prompts per generation call.
      before: also evaluate before the first step.
    """

    every: int = 0
    num_examples: int | None = None
    batch_size: int = 64
    before: bool = True

    def __post_init__(self):
        _at_least("eval.every", self.every, 0, "0 = only before and after training")
        _at_least("eval.num_examples", self.num_examples, 1, "or null: all")
        _at_least("eval.batch_size", self.batch_size, 1)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole ``jaxrl-llm train`` config (see the module docstring)."""

    output_dir: str
    max_steps: int
    algorithm: str
    seed: int = 0
    resume: bool = False
    max_nonfinite_steps: int = 3
    model: ModelSection = ModelSection()
    optim: OptimSection = OptimSection()
    mesh: MeshSection = MeshSection()
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection()
    data: DataSection = DataSection()
    loss: dict[str, Any] = dataclasses.field(default_factory=dict)
    train: TrainSection = TrainSection()
    rollout: RolloutSection = RolloutSection()
    rewards: tuple[RewardItem, ...] = ()
    eval: EvalSection = EvalSection()
    ppo: PPOSection = PPOSection()
    process_reward: ProcessRewardSection | None = None

    def __post_init__(self):
        allowed = ONLINE_ALGORITHMS + OFFLINE_ALGORITHMS
        if self.algorithm not in allowed:
            raise ConfigError(f"algorithm: unknown {self.algorithm!r}; allowed: "
                              f"{', '.join(allowed)}")
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}")
        if not self.output_dir.strip():
            raise ConfigError("output_dir: a run directory is required, e.g. output_dir=runs/x")
        if self.max_nonfinite_steps < 1:
            raise ConfigError(f"max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        if not self.data.train:
            raise ConfigError("data.train: a training data file or directory is required")
        if self.model.source == "tiny" and self.model.tokenizer != "char":
            raise ConfigError("model.source=tiny needs model.tokenizer=char (a random model has "
                              "no tokenizer of its own)")
        if self.is_online:
            r = self.rollout
            if r.group_size < 2 and self.algorithm in ("grpo", "dr_grpo", "dapo", "gspo",
                                                        "rloo", "reinforce_pp", "online_dpo"):
                raise ConfigError(f"rollout.group_size={r.group_size}: {self.algorithm} needs "
                                  f"groups of at least 2 samples per prompt")
            if self.algorithm == "ppo" and self.model.lora is not None:
                raise ConfigError("model.lora: PPO's critic is a value head on a full copy of "
                                  "the policy; LoRA is not supported for ppo yet")
            if self.process_reward is not None and self.algorithm not in ("grpo", "dr_grpo",
                                                                          "dapo", "gspo"):
                raise ConfigError(f"process_reward: process supervision is defined for the "
                                  f"GRPO family, not {self.algorithm}")
            if not self.rewards:
                raise ConfigError("rewards: an online algorithm needs at least one reward "
                                  "function, e.g. rewards: [{name: math_answer}]")
            n = r.prompts_per_step * r.group_size
            if n % r.minibatches:
                raise ConfigError(f"rollout.minibatches={r.minibatches} must divide the "
                                  f"{n} rows of a rollout batch")
            for name in ("prompts_per_step", "group_size", "max_new_tokens", "epochs",
                         "minibatches", "max_sampling_rounds", "micro_batch_groups"):
                if getattr(r, name) < 1:
                    raise ConfigError(f"rollout.{name} must be >= 1, got {getattr(r, name)}")
            _check_sampling(r)
        else:
            t = self.train
            if t.batch_size < 1 or t.micro_batches < 1 or t.batch_size % t.micro_batches:
                raise ConfigError(f"train.micro_batches={t.micro_batches} must divide "
                                  f"train.batch_size={t.batch_size} (both >= 1)")
            if self.rewards:
                raise ConfigError(f"rewards: {self.algorithm} is an offline algorithm and uses "
                                  f"no reward functions; remove the rewards section")

    @property
    def is_online(self) -> bool:
        """True for the online RL algorithms (rollout → reward → update)."""
        return self.algorithm in ONLINE_ALGORITHMS


def _check_sampling(r: RolloutSection) -> None:
    """The rollout's sampling settings, named as config keys (what SamplingConfig allows)."""
    if not (r.temperature > 0 and math.isfinite(r.temperature)):
        raise ConfigError(f"rollout.temperature must be a finite number > 0, got "
                          f"{r.temperature}")
    if r.top_k < 0:
        raise ConfigError(f"rollout.top_k must be >= 0 (0 = off), got {r.top_k}")
    if not 0.0 < r.top_p <= 1.0:
        raise ConfigError(f"rollout.top_p must be in (0, 1] (1 = off), got {r.top_p}")
    if not 0.0 <= r.min_p < 1.0:
        raise ConfigError(f"rollout.min_p must be in [0, 1) (0 = off), got {r.min_p}")
    if r.overlong_buffer is not None and not 0 < r.overlong_buffer <= r.max_new_tokens:
        raise ConfigError(f"rollout.overlong_buffer={r.overlong_buffer} must be between 1 and "
                          f"rollout.max_new_tokens={r.max_new_tokens} (or null: off)")
    if not r.overlong_penalty_factor >= 0:
        raise ConfigError(f"rollout.overlong_penalty_factor must be >= 0, got "
                          f"{r.overlong_penalty_factor}")


def loss_name(cfg: RunConfig) -> str:
    """The registry loss an algorithm trains its policy with (PPO: ``ppo_actor``; online DPO:
    ``dpo`` on pairs chosen from the policy's own samples)."""
    return {"ppo": "ppo_actor", "online_dpo": "dpo"}.get(cfg.algorithm, cfg.algorithm)


def loss_config(cfg: RunConfig):
    """The algorithm's loss config: its paper preset with ``cfg.loss`` validated on top."""
    from jaxrl_llm.losses import get_loss
    from jaxrl_llm.train.config_io import from_dict, to_dict

    spec = get_loss(loss_name(cfg))
    try:
        base = to_dict(spec.preset())
    except TypeError:  # the preset has required fields (e.g. pairwise_rank's group_size)
        base = {}
    overrides = dict(cfg.loss)
    if cfg.is_online and "temperature" not in overrides and "temperature" in base \
            and cfg.algorithm != "online_dpo":
        overrides["temperature"] = cfg.rollout.temperature  # the loss uses the sampling τ
    if cfg.is_online and "max_len" in base and base.get("max_len") is not None \
            and "max_len" not in overrides:
        overrides["max_len"] = cfg.rollout.max_new_tokens
    if cfg.is_online and "logprob_window" in base and "logprob_window" not in overrides:
        # rollout batches keep every target in their last max_new_tokens columns
        overrides["logprob_window"] = cfg.rollout.max_new_tokens
    r = cfg.rollout
    whole_groups = r.prompts_per_step % r.minibatches == 0  # each minibatch holds whole groups
    if cfg.is_online and "prompt_group_size" in base and "prompt_group_size" not in overrides:
        # rollout batches hold group_size consecutive completions of each prompt: the update's
        # forward computes each prompt once per group (set loss.prompt_group_size=1 to disable)
        overrides["prompt_group_size"] = r.group_size if whole_groups else 1
    elif cfg.is_online and overrides.get("prompt_group_size", 1) not in (1, r.group_size):
        raise ConfigError(f"loss.prompt_group_size={overrides['prompt_group_size']} must be 1 "
                          f"or rollout.group_size={r.group_size}")
    elif cfg.is_online and overrides.get("prompt_group_size", 1) > 1 and not whole_groups:
        raise ConfigError(f"loss.prompt_group_size>1 needs minibatches of whole groups: "
                          f"rollout.minibatches={r.minibatches} must divide "
                          f"rollout.prompts_per_step={r.prompts_per_step}")
    return from_dict(spec.config_cls, {**base, **overrides}, prefix="loss")


def update_micro_batches(cfg: RunConfig, loss_cfg=None, *, shards: int = 1) -> int:
    """How many micro-batches an online minibatch update is split into so that groups whose
    advantages are all zero can be skipped (``rollout.skip_zero_advantage``).

    Each micro-batch holds k whole groups: the smallest k ≥ ``rollout.micro_batch_groups``
    that divides the minibatch's groups into at least two micro-batches and is a multiple of
    ``shards`` (the mesh's data × fsdp devices: every device then holds whole groups), else
    the smallest whose k·G rows split over the shards. 1 when skipping does not apply: an offline or pairwise algorithm,
    PPO (critic advantages), a loss with a β·KL or entropy term, minibatches that split groups.
    """
    from jaxrl_llm.losses import get_loss

    r = cfg.rollout
    if not cfg.is_online or cfg.algorithm in ("online_dpo", "ppo") or not r.skip_zero_advantage \
            or r.group_size < 2 or r.prompts_per_step % r.minibatches:
        return 1
    spec = get_loss(loss_name(cfg))
    if spec.zero_batch_fn is None or spec.zero_batch_fn(loss_cfg or loss_config(cfg)) is None:
        return 1
    groups = r.prompts_per_step // r.minibatches
    sizes = range(max(1, r.micro_batch_groups), groups + 1)
    # First choice: k a multiple of the shards, so each device holds whole groups (the shared
    # prompt is then computed without crossing devices); else any k whose rows split evenly.
    for fits in (lambda k: k % shards == 0, lambda k: (k * r.group_size) % shards == 0):
        for k in sizes:
            if groups % k == 0 and groups // k > 1 and fits(k):
                return groups // k
    return 1
