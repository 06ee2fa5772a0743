"""The sections of a ``jaxrl-llm train`` config, one frozen dataclass each (the whole config is
:class:`jaxrl_llm.train.config.run_config.RunConfig`). Each validates its own fields: a bad value is a
one-line :class:`~jaxrl_llm.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import Any, Literal

from jaxrl_llm.errors import ConfigError, check_at_least
from jaxrl_llm.train.config.online_sections import (  # noqa: F401  (re-exported: sections)
    CorrectionSection,
    DistillSection,
    EnvSection,
    PPOSection,
    ProcessRewardSection,
    RewardItem,
    RolloutSection,
    TeacherSection,
)


@dataclasses.dataclass(frozen=True)
class LoRASection:
    """LoRA adapters (``jaxrl_llm.models.lora``): rank, alpha, target projections, and how the
    frozen base is stored: ``base_dtype`` float32 (default, as before), bfloat16, or quantised
    int8 (per-output-channel scales) / nf4 (QLoRA's 4-bit NormalFloat, blocks of 64), the
    seven dense projections quantised and dequantised per layer in the forward
    (``jaxrl_llm.models.quant``); adapters and optimizer state stay float32."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    base_dtype: str = "float32"

    def __post_init__(self):
        from jaxrl_llm.models.lora import ALL_TARGETS
        from jaxrl_llm.models.quant import BASE_DTYPES

        if self.base_dtype not in BASE_DTYPES:
            raise ConfigError(
                f"model.lora.base_dtype: unknown {self.base_dtype!r}; allowed: {list(BASE_DTYPES)}"
            )
        if self.rank < 1:
            raise ConfigError(
                f"model.lora.rank must be >= 1, got {self.rank} (for full "
                f"fine-tuning set model.lora=null)"
            )
        if not self.alpha > 0:
            raise ConfigError(f"model.lora.alpha must be > 0, got {self.alpha}")
        unknown = [t for t in self.targets if t not in ALL_TARGETS]
        if unknown or not self.targets:
            raise ConfigError(
                f"model.lora.targets: unknown {unknown or 'empty list'}; allowed: "
                f"{list(ALL_TARGETS)}"
            )


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """Which model to train and how to run it.

    Attributes:
      source: HF directory, .gguf file, PEFT adapter directory (on its base), hub id
        ``org/name`` (from the HF cache), ``smollm2-135m-instruct``, or ``tiny`` (random init,
        for tests; ``tiny`` holds ModelConfig.tiny overrides and ``tokenizer`` must be ``char``).
      tokenizer: ``auto`` (from the source) or ``char`` (byte-level test tokenizer).
      param_dtype / compute_dtype: ``float32`` or ``bfloat16`` (master weights stay float32).
      remat: rematerialisation per layer: none | dots | full.
      lora: LoRA adapters instead of full fine-tuning (null = full fine-tuning).
      freeze_embeddings: keep the (tied) embedding matrix frozen during full fine-tuning.
      attention: ``auto`` (the backend's fused kernel where it applies, blockwise O(T)-memory
        attention for long sequences, naive for short ones), or force ``naive`` /
        ``blockwise`` / ``cudnn`` / ``splash`` (``jaxrl_llm.models.AttentionImpl``).
      router_aux_loss_coef: a mixture of experts' load-balancing loss coefficient α: the
        training loss gains α · aux (Switch Transformer, Fedus et al. 2021,
        https://arxiv.org/abs/2101.03961; logged as ``moe/aux_loss``, before α). null (default)
        = the checkpoint's own ``router_aux_loss_coef`` (0.001 for Qwen3-MoE and Mixtral);
        0 = off. Ignored by dense models.
    """

    source: str = "smollm2-135m-instruct"
    tokenizer: Literal["auto", "char"] = "auto"
    tiny: dict[str, Any] | None = None
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    remat: Literal["none", "dots", "full"] = "none"
    lora: LoRASection | None = None
    freeze_embeddings: bool = False
    attention: Literal["auto", "naive", "blockwise", "cudnn", "splash"] = "auto"
    router_aux_loss_coef: float | None = None

    def __post_init__(self):
        coef = self.router_aux_loss_coef
        if coef is not None and not (coef >= 0 and math.isfinite(coef)):
            raise ConfigError(
                f"model.router_aux_loss_coef must be a finite number >= 0 (or null: the "
                f"checkpoint's), got {coef}"
            )


@dataclasses.dataclass(frozen=True)
class OptimSection:
    """Optimizer (optax): AdamW by default, with a learning-rate schedule and clipping.

    ``warmup_steps``: linear warm-up from 0 to ``lr`` over that many updates, so the first
    update has learning rate 0 (as transformers' ``get_linear_schedule_with_warmup``); the
    schedule then runs over the remaining updates. 0 = no warm-up.
    """

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
            raise ConfigError(
                f"optim.grad_clip must be > 0 (or null: no clipping), got {self.grad_clip}"
            )


@dataclasses.dataclass(frozen=True)
class MeshSection:
    """Mesh axis sizes; -1 = all remaining devices. ``expert`` splits a mixture of experts'
    experts over that many devices (tokens replicated over them; ``jaxrl_llm.models.moe``);
    it must divide the model's number of experts. ``context`` splits every row's tokens over
    that many devices (context parallelism: ring attention, Liu et al. 2023,
    https://arxiv.org/abs/2310.01889; ``jaxrl_llm.models.ring_attention``): the train step's
    token axis T is padded to a multiple of it (padding changes no result) and the rollout
    runs unsharded along T; ``train.preflight.check_mesh`` says what it cannot run with."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1
    context: int = 1

    def __post_init__(self):
        sizes = {
            "data": self.data,
            "fsdp": self.fsdp,
            "tensor": self.tensor,
            "expert": self.expert,
            "context": self.context,
        }
        for name, size in sizes.items():
            if size == 0 or size < -1:
                raise ConfigError(
                    f"mesh.{name}={size} is invalid; use a positive size or -1 "
                    f"(all remaining devices)"
                )
        if sum(size == -1 for size in sizes.values()) > 1:
            raise ConfigError(
                f"mesh: only one of data/fsdp/tensor/expert/context may be -1, got {sizes}"
            )


@dataclasses.dataclass(frozen=True)
class DistributedSection:
    """A multi-process job (``jaxrl-llm train --coordinator ... --num-processes N``).
    ``failure_timeout_s``: seconds a process of the job may go silent (killed, out of memory,
    its host gone) before the others stop with one line naming it and the last complete
    checkpoint (:mod:`jaxrl_llm.parallel.peers`); a process that exits is seen at once. JAX's
    own heartbeat aborts the job 30 s later, as a backstop."""

    failure_timeout_s: float = 60.0

    def __post_init__(self):
        if not 1 <= self.failure_timeout_s <= 3600:
            raise ConfigError(
                f"distributed.failure_timeout_s must be in [1, 3600] seconds, got "
                f"{self.failure_timeout_s}"
            )


#: tracker name -> (the module it imports, the pip package that provides it)
TRACKER_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboardX", "tensorboardX"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),
}


def missing_package(tracker: str) -> str | None:
    """The pip package ``tracker`` needs when its module cannot be imported here, else None."""
    module, pip_name = TRACKER_PACKAGES[tracker]
    return pip_name if importlib.util.find_spec(module) is None else None


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    """Where metrics go: ``output_dir/metrics.jsonl`` always (one key set per run,
    docs/metrics.md), and the experiment trackers that mirror it.

    ``trackers``: any of ``tensorboard`` (``output_dir/tb``), ``wandb``, ``mlflow``; each is
    given every row of metrics.jsonl, the resolved config, and is closed when the run ends or
    stops (:mod:`jaxrl_llm.train.run.trackers`). A listed tracker whose package is missing is
    refused before the run starts (``pip install jaxrl_llm[trackers]``). Unset (the default),
    the older keys decide: ``tensorboard: true`` (the default) writes TensorBoard events when
    ``tensorboardX`` is installed (skipped with a note when it is not), and ``wandb_project``
    turns W&B on. With ``trackers`` set, ``tensorboard: false`` while listing ``tensorboard``,
    or ``wandb_project`` without listing ``wandb``, is refused as a contradiction.

    ``project``: the W&B project and the MLflow experiment (default ``wandb_project``, else
    ``jaxrl_llm``); ``wandb_project`` is its older name, for W&B. ``run_name``: the run's name
    there (default: the last part of ``output_dir``). W&B and MLflow read their own
    environment variables: ``WANDB_MODE=offline``, ``WANDB_DIR``, ``MLFLOW_TRACKING_URI``.

    ``samples_every: N`` (online runs) writes every N-th step's episodes to
    ``samples.jsonl`` in the log directory (``dir`` below), one line per episode: ``{"step",
    "prompt_id", "sample", "messages", "reward"}`` (0 = never). Across processes each writes
    its own episodes, process k to ``samples.process-k.jsonl``.

    ``dir``: a local directory for the logs and metrics (``metrics.jsonl``, ``config.yaml``,
    TensorBoard, plots, samples, ``summary.json``). Default: ``output_dir`` when it is local;
    when ``output_dir`` is a URI (``gs://bucket/run``, checkpoints only),
    ``jaxrl-llm-logs/<run name>`` under the working directory, named in the run's start line
    (:func:`jaxrl_llm.train.run.paths.log_dir`).
    """

    log_every: int = 1
    tensorboard: bool = True
    wandb_project: str | None = None
    plots: bool = True
    samples_every: int = 0
    trackers: tuple[Literal["tensorboard", "wandb", "mlflow"], ...] | None = None
    project: str | None = None
    run_name: str | None = None
    dir: str | None = None

    def __post_init__(self):
        if self.dir is not None and "://" in self.dir and not self.dir.startswith("file://"):
            raise ConfigError(
                f"logging.dir {self.dir!r}: logs and metrics are written to a local directory; "
                f"give a local path (output_dir may be a bucket)"
            )
        check_at_least("logging.log_every", self.log_every, 1)
        check_at_least("logging.samples_every", self.samples_every, 0, "0 = never")
        if self.trackers is None:
            return
        if len(set(self.trackers)) != len(self.trackers):
            raise ConfigError(f"logging.trackers: {list(self.trackers)} names one twice")
        if not self.tensorboard and "tensorboard" in self.trackers:
            raise ConfigError(
                "logging.tensorboard: false, but logging.trackers lists tensorboard; drop one"
            )
        if self.wandb_project and "wandb" not in self.trackers:
            raise ConfigError(
                f"logging.wandb_project: {self.wandb_project!r} is set, but logging.trackers "
                f"{list(self.trackers)} does not list wandb; add it or drop wandb_project"
            )
        if self.project and self.wandb_project and self.project != self.wandb_project:
            raise ConfigError(
                f"logging.project {self.project!r} and logging.wandb_project "
                f"{self.wandb_project!r} differ; wandb_project is the older name of project"
            )

    def active_trackers(self) -> tuple[str, ...]:
        """The trackers this run opens: ``trackers``, or what the older keys say."""
        if self.trackers is not None:
            return tuple(self.trackers)
        return ("tensorboard",) * self.tensorboard + ("wandb",) * bool(self.wandb_project)

    def required_trackers(self) -> tuple[str, ...]:
        """The trackers asked for by name (their packages must be installed): ``trackers``,
        or ``wandb`` for ``wandb_project``; the default TensorBoard is not among them."""
        if self.trackers is not None:
            return tuple(self.trackers)
        return ("wandb",) if self.wandb_project else ()


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    """Orbax checkpoints under ``output_dir/checkpoints``; 0 = only at the end."""

    save_every: int = 0
    keep: int = 2
    export_hf: bool = False

    def __post_init__(self):
        check_at_least("checkpoint.save_every", self.save_every, 0, "0 = only at the end")
        check_at_least("checkpoint.keep", self.keep, 1)


@dataclasses.dataclass(frozen=True)
class DataSection:
    """The data set(s): JSONL / Parquet / saved HF datasets, or ``hf:org/name`` from the
    Hugging Face cache; the row formats are TRL's (docs/data.md). ``loss_on``: an SFT row's targets, ``assistant`` (every
    assistant turn of a ``messages`` row; the completion of a prompt-completion row),
    ``completion`` (the last assistant message / the completion) or ``all`` (every token);
    ``jaxrl_llm.data.LossOn``."""

    train: str = ""
    eval: str | None = None
    max_length: int = 512
    length_policy: Literal["error", "truncate", "drop"] = "truncate"
    packing: bool = False
    shuffle: bool = True
    loss_on: Literal["assistant", "completion", "all"] = "assistant"

    def __post_init__(self):
        if self.max_length < 2:
            raise ConfigError(
                f"data.max_length must be >= 2 tokens (a prompt token and a "
                f"completion token), got {self.max_length}"
            )


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """Offline training loop options."""

    batch_size: int = 8
    micro_batches: int = 1
    eval_every: int = 0
    eval_batches: int | None = None
    reference: Literal["on_the_fly", "precompute"] = "on_the_fly"

    def __post_init__(self):
        check_at_least("train.eval_every", self.eval_every, 0, "0 = only before and after training")
        check_at_least("train.eval_batches", self.eval_batches, 1, "or null: all")


@dataclasses.dataclass(frozen=True)
class LogprobSection:
    """How the losses compute per-token log-probs (performance, not hyperparameters).

    Attributes:
      chunk_size: time chunk of the chunked log-prob op (memory vs. speed).
      shared_prompt: online group RL: compute each prompt once per group in the update's
        forward (same log-probs up to float rounding, fewer FLOPs); needs minibatches of
        whole groups (``rollout.minibatches`` dividing ``rollout.prompts_per_step``).
      pack: online policy-gradient RL (GRPO family, PPO's actor): the update's forward and
        backward run on packed rows — every episode's real tokens (prompt + completion) one
        segment, several per row (``jaxrl_llm.data.pack_rl_batch``) — instead of one padded
        row each; the per-token quantities are unpacked exactly. Overrides
        ``shared_prompt`` (a packed row has no per-group prompt). The better choice when
        completion lengths vary widely (long-tail reasoning lengths); the shared prompt when
        prompts are long and completions short. The reference and correction forwards stay
        padded.
      pack_length: the packed rows' length (null: the padded batch's length; rounded up to a
        multiple of ``mesh.context``); at least the longest episode.
    """

    chunk_size: int = 128
    shared_prompt: bool = True
    pack: bool = False
    pack_length: int | None = None

    def __post_init__(self):
        check_at_least("logprobs.chunk_size", self.chunk_size, 1)
        if self.pack_length is not None:
            check_at_least("logprobs.pack_length", self.pack_length, 2)


@dataclasses.dataclass(frozen=True)
class ScheduleItem:
    """A schedule of one loss hyperparameter, from the ``loss`` value to ``end``; the value
    is a traced input of the train step, so it does not recompile.

    Attributes:
      name: a traceable hyperparameter of the algorithm's loss (``LossSpec.traced_hparams``,
        e.g. ``kl_coef``).
      end: the value after ``steps`` steps. kind: ``linear`` or ``cosine`` (optax schedules).
      steps: steps to reach ``end`` (null = ``max_steps``).
    """

    name: str
    end: float
    kind: Literal["linear", "cosine"] = "linear"
    steps: int | None = None

    def __post_init__(self):
        check_at_least(f"schedules[{self.name}].steps", self.steps, 1, "or null: max_steps")
        if not math.isfinite(self.end) or self.end < 0:
            raise ConfigError(
                f"schedules[{self.name}].end must be a finite number >= 0, got {self.end}"
            )


@dataclasses.dataclass(frozen=True)
class EvalSection:
    """Held-out evaluation of an online run: greedy decoding, mean of the first reward.

    Attributes:
      every: evaluate every N steps (0 = only before and after training).
      num_examples: how many held-out prompts (null = all).
      batch_size: prompts per generation call.
      before: also evaluate before the first step.
      num_samples: n sampled completions per held-out prompt (at the rollout's temperature)
        besides the greedy one (0 = greedy only); pass_at: the k of ``eval/pass@k``, the
        unbiased estimator of Chen et al. 2021 over those n samples (a sample is correct when
        the first reward scores it 1).
      maj_at: the k of ``eval/maj@k``: the share of prompts whose most frequent extracted
        answer among k of those samples is correct (self-consistency;
        :mod:`jaxrl_llm.rewards.voting`; computed by ``jaxrl-llm train`` and the Python
        API's trainers alike, :func:`jaxrl_llm.train.online.voting_eval.vote_eval`).
      write_samples: write each evaluation's sampled completions, their extracted answers,
        rewards and votes to ``eval/samples-<step>.jsonl`` (one line per prompt; needs
        ``num_samples``).
    """

    every: int = 0
    num_examples: int | None = None
    batch_size: int = 64
    before: bool = True
    num_samples: int = 0
    pass_at: tuple[int, ...] = ()
    maj_at: tuple[int, ...] = ()
    write_samples: bool = False

    def __post_init__(self):
        check_at_least("eval.every", self.every, 0, "0 = only before and after training")
        check_at_least("eval.num_examples", self.num_examples, 1, "or null: all")
        check_at_least("eval.batch_size", self.batch_size, 1)
        check_at_least("eval.num_samples", self.num_samples, 0, "0 = greedy only")
        for name, ks in (("pass_at", self.pass_at), ("maj_at", self.maj_at)):
            for k in ks:
                if not 1 <= k <= self.num_samples:
                    raise ConfigError(
                        f"eval.{name}: k={k} must be between 1 and eval.num_samples="
                        f"{self.num_samples}"
                    )
        if self.write_samples and not self.num_samples:
            raise ConfigError("eval.write_samples needs eval.num_samples >= 1 (samples to write)")
