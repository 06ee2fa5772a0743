"""Typed run configs with TRL's vocabulary: ``GRPOConfig``, ``SFTConfig``, ``DPOConfig``, ...

A TRL user writes ``GRPOConfig(output_dir=..., learning_rate=..., num_generations=...,
peft_config=LoraConfig(...))`` and hands it to a trainer as ``args``; :meth:`TrainingConfig.
to_dict` turns it into this package's run config (``optim.lr``, ``rollout.group_size``,
``model.lora``, ...), which is what runs, is validated and is saved as ``config.yaml``. Only the
names TRL has are here; everything else is reached through ``extra`` (nested sections, merged
last: ``extra={"rollout": {"engine": "paged"}}``). A YAML file spells each key one way: TRL's
names there are refused with the key to use (``config_io.TRL_NAMES``).

Batch sizes: TRL's ``per_device_train_batch_size`` × devices × ``gradient_accumulation_steps``
is the global batch of one optimizer step (completions online, rows offline); it becomes
``rollout.prompts_per_step`` (that count over ``num_generations``) or ``train.batch_size`` (with
``train.micro_batches = gradient_accumulation_steps``). The devices are ``jax.device_count()``
when the config is converted.

Example::

    from peft import LoraConfig
    args = jaxrl_llm.GRPOConfig(output_dir="runs/g", max_steps=50, learning_rate=1e-5,
                                num_generations=8, peft_config=LoraConfig(r=16, lora_alpha=32))
    jaxrl_llm.GRPOTrainer(model="smollm2-135m-instruct", reward_funcs=[fn],
                          train_dataset=rows, args=args).train()
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.train.trl_checks import check_fields, checked_init

log = logging.getLogger("jaxrl_llm")


def lora_section(peft_config: Any) -> dict | None:
    """``model.lora`` of a ``peft.LoraConfig`` (``r`` → rank, ``lora_alpha`` → alpha,
    ``target_modules`` → targets: ``"all-linear"`` is every projection; None is PEFT's default
    for the model families here, ``q_proj`` and ``v_proj``), a dict of the section, or None. ``lora_dropout`` has no counterpart (the adapters here have no dropout):
    a nonzero one is reported and not applied.

    Raises:
      ConfigError: a value that is neither, or a target this package's LoRA does not have.
    """
    if peft_config is None:
        return None
    if isinstance(peft_config, Mapping):
        return dict(peft_config)
    if dataclasses.is_dataclass(peft_config) and hasattr(peft_config, "rank"):
        return {f.name: getattr(peft_config, f.name) for f in dataclasses.fields(peft_config)}
    if not hasattr(peft_config, "r"):
        raise ConfigError(
            f"peft_config: expected a peft.LoraConfig or a dict of model.lora, got "
            f"{type(peft_config).__name__}"
        )
    from jaxrl_llm.models.lora import ALL_TARGETS

    out: dict[str, Any] = {"rank": int(peft_config.r)}
    alpha = getattr(peft_config, "lora_alpha", None)
    if alpha is not None:
        out["alpha"] = float(alpha)
    targets = getattr(peft_config, "target_modules", None)
    if targets is None:  # PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for
        targets = ["q_proj", "v_proj"]  # llama, qwen2/3, gemma 1-3, mistral, mixtral
    if isinstance(targets, str) and targets != "all-linear":
        targets = [targets]
    if targets != "all-linear":
        out["targets"] = sorted(targets)
        unknown = [t for t in out["targets"] if t not in ALL_TARGETS]
        if unknown:
            raise ConfigError(
                f"peft_config.target_modules: {unknown} are not projections here; "
                f"allowed: {list(ALL_TARGETS)} (or 'all-linear')"
            )
    dropout = float(getattr(peft_config, "lora_dropout", 0.0) or 0.0)
    if dropout:
        log.warning(
            "peft_config.lora_dropout=%g is not applied: these adapters have no dropout", dropout
        )
    return out


def dataset_rows(dataset: Any) -> int | None:
    """The number of rows of a training dataset as a trainer takes it (a list, a
    ``datasets.Dataset``, anything with ``len``; a ``.jsonl`` path: its non-blank lines), or
    None when it is not known without reading it (an iterable, a hub name)."""
    if isinstance(dataset, (str, os.PathLike)):
        path = os.fspath(dataset)
        if not (path.endswith(".jsonl") and os.path.isfile(path)):
            return None
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    try:
        return len(dataset)
    except TypeError:
        return None


def _advantage_scale(scale_rewards: str | bool) -> str:
    """``rollout.advantage_scale`` of TRL's ``scale_rewards`` (True: ``group``, False:
    ``none``)."""
    if isinstance(scale_rewards, bool):
        return "group" if scale_rewards else "none"
    return scale_rewards


def _devices() -> int:
    import jax

    return jax.device_count()


@dataclasses.dataclass(kw_only=True)
class TrainingConfig:
    """The fields every algorithm shares, by TRL's (transformers' ``TrainingArguments``) names.

    Attributes:
      output_dir: the run directory (``output_dir``).
      max_steps: optimizer steps (``max_steps``); -1 (TRL's default): ``num_train_epochs``
        passes over the training dataset (:meth:`steps`).
      num_train_epochs: passes over the training dataset when ``max_steps`` is -1 (TRL's
        default 3); a fraction is a part of one.
      learning_rate: peak learning rate (``optim.lr``).
      lr_scheduler_type: ``constant``, ``cosine`` or ``linear`` (``optim.schedule``).
      warmup_steps: linear warm-up steps (``optim.warmup_steps``).
      warmup_ratio: warm-up as a fraction of the steps, used when ``warmup_steps`` is 0.
      weight_decay: AdamW's decoupled weight decay (``optim.weight_decay``).
      adam_beta1, adam_beta2, adam_epsilon: Adam's β₁, β₂, ε (``optim.b1``, ``b2``, ``eps``).
      max_grad_norm: global gradient-norm clip, None = off (``optim.grad_clip``).
      per_device_train_batch_size: with the devices and ``gradient_accumulation_steps``, the
        global batch of one step (module docstring); None: the algorithm's default.
      gradient_accumulation_steps: see ``per_device_train_batch_size``.
      seed: the run's seed (``seed``).
      logging_steps: log every N steps (``logging.log_every``).
      save_steps: checkpoint every N steps, 0 = at the end only (``checkpoint.save_every``).
      save_total_limit: checkpoints kept (``checkpoint.keep``).
      eval_steps: evaluate every N steps, 0 = before and after only.
      report_to: trackers: ``"none"``, one name or a list of ``tensorboard``, ``wandb``,
        ``mlflow`` (``logging.trackers``); None: the default.
      run_name: the trackers' run name (``logging.run_name``).
      bf16: compute in bfloat16 (``model.compute_dtype``).
      gradient_checkpointing: recompute activations in the backward (``model.remat: full``).
      resume_from_checkpoint: continue from the newest checkpoint in ``output_dir``
        (``resume``; a path is refused: the run resumes its own directory).
      peft_config: a ``peft.LoraConfig`` (or a dict of ``model.lora``): LoRA adapters on a
        frozen base (:func:`lora_section`); None: full fine-tuning.
      extra: any other keys of the run config, as nested sections, merged last.
    """

    algorithm: ClassVar[str] = ""

    output_dir: str
    max_steps: int = -1
    num_train_epochs: float = 3.0
    learning_rate: float = 1e-5
    lr_scheduler_type: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float | None = 1.0
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int = 1
    seed: int = 0
    logging_steps: int = 1
    save_steps: int = 0
    save_total_limit: int = 2
    eval_steps: int = 0
    report_to: str | list[str] | None = None
    run_name: str | None = None
    bf16: bool = False
    gradient_checkpointing: bool = False
    resume_from_checkpoint: bool = False
    peft_config: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self)  # every field's type and range (trl_checks.RANGES)

    def steps(self, num_rows: int | None) -> int:
        """Optimizer steps: ``max_steps``, or with -1 (TRL's default) ``num_train_epochs``
        passes over ``num_rows`` training rows, ⌈epochs × rows / rows per step⌉ (rows per step:
        prompts online, rows offline), at least 1.

        Raises:
          ConfigError: ``max_steps`` is -1 and the dataset's size is not known.
        """
        if self.max_steps != -1:
            return self.max_steps
        if num_rows is None:
            raise ConfigError(
                f"{type(self).__name__}: max_steps=-1 trains num_train_epochs="
                f"{self.num_train_epochs:g} epochs, which needs the training dataset's size: "
                f"pass train_dataset (rows or a .jsonl file), or give max_steps"
            )
        return max(1, math.ceil(self.num_train_epochs * num_rows / self._rows_per_step()))

    def _rows_per_step(self) -> int:
        """Training rows one step consumes (the subclasses)."""
        raise NotImplementedError

    def to_dict(self, num_rows: int | None = None) -> dict:
        """The run config this stands for, as the nested dict a trainer's ``args`` takes;
        ``num_rows`` (the training dataset's size) turns epochs into steps (:meth:`steps`)."""
        max_steps = self.steps(num_rows)
        warmup = self.warmup_steps or math.ceil(self.warmup_ratio * max_steps)
        out: dict[str, Any] = {
            "algorithm": self.algorithm,
            "output_dir": self.output_dir,
            "max_steps": max_steps,
            "seed": self.seed,
            "resume": self.resume_from_checkpoint,
            "optim": {
                "lr": self.learning_rate,
                "schedule": self.lr_scheduler_type,
                "warmup_steps": warmup,
                "weight_decay": self.weight_decay,
                "b1": self.adam_beta1,
                "b2": self.adam_beta2,
                "eps": self.adam_epsilon,
                "grad_clip": self.max_grad_norm,
            },
            "logging": {"log_every": self.logging_steps, "run_name": self.run_name},
            "checkpoint": {"save_every": self.save_steps, "keep": self.save_total_limit},
            "model": {},
        }
        if self.report_to is not None:
            names = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
            out["logging"]["trackers"] = [n for n in names if n != "none"]
        if self.bf16:
            out["model"]["compute_dtype"] = "bfloat16"
        if self.gradient_checkpointing:
            out["model"]["remat"] = "full"
        lora = lora_section(self.peft_config)
        if lora is not None:
            out["model"]["lora"] = lora
        self._algorithm_keys(out)
        return _merge(out, self.extra)

    def _algorithm_keys(self, out: dict) -> None:
        """Add the algorithm's own keys to ``out`` (the subclasses)."""

    def _global_batch(self) -> int | None:
        """per_device_train_batch_size × devices × gradient_accumulation_steps, or None."""
        if self.per_device_train_batch_size is None:
            return None
        return self.per_device_train_batch_size * _devices() * self.gradient_accumulation_steps


@dataclasses.dataclass(kw_only=True)
class GRPOConfig(TrainingConfig):
    """GRPO (``algorithm: grpo``) by TRL's ``GRPOConfig`` names; the shared fields are
    :class:`TrainingConfig`'s.

    Attributes:
      num_generations: G completions per prompt (``rollout.group_size``).
      prompts_per_step: prompts per step (``rollout.prompts_per_step``), when
        ``per_device_train_batch_size`` is not given (then it is that global count of
        completions over ``num_generations``, which must divide it).
      max_completion_length: tokens a completion may have (``rollout.max_new_tokens``).
      max_prompt_length: tokens a prompt may have (``data.max_length``).
      temperature, top_p, top_k, min_p: sampling (``rollout.*``; top_k 0 = off).
      num_iterations: passes over each batch (μ; ``rollout.epochs``).
      beta: β of the KL penalty to the reference (``loss.kl_coef``; None: the algorithm's
        default; > 0 runs a reference model).
      epsilon: the ratio clip ε (``loss.clip_eps``; None: the default).
      mask_truncated_completions: no loss on completions cut at the length limit
        (``rollout.mask_truncated``).
      scale_rewards: divide advantages by the reward's std over the ``"group"`` (True), the
        ``"batch"``, or not at all (``"none"``, False; Dr. GRPO) (``rollout.advantage_scale``).
      eval_num_samples, pass_at, maj_at: sampled completions per held-out prompt and the k
        of ``eval/pass@k`` and ``eval/maj@k`` (``eval.num_samples``, ``eval.pass_at``,
        ``eval.maj_at``).
    """

    algorithm: ClassVar[str] = "grpo"
    beta_key: ClassVar[str] = "kl_coef"

    num_generations: int = 8
    prompts_per_step: int = 4
    max_completion_length: int = 64
    max_prompt_length: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    num_iterations: int = 1
    beta: float | None = None
    epsilon: float | None = None
    mask_truncated_completions: bool = False
    scale_rewards: Literal["group", "batch", "none"] | bool = "group"
    eval_num_samples: int = 0
    pass_at: tuple[int, ...] = ()
    maj_at: tuple[int, ...] = ()

    def _rows_per_step(self) -> int:
        """Prompts per step: ``prompts_per_step``, or the global batch of completions over
        ``num_generations``."""
        rows = self._global_batch()
        if rows is None:
            return self.prompts_per_step
        if rows % self.num_generations:
            raise ConfigError(
                f"per_device_train_batch_size x {_devices()} devices x "
                f"gradient_accumulation_steps = {rows} completions per step is not a "
                f"multiple of num_generations={self.num_generations}"
            )
        return rows // self.num_generations

    def _algorithm_keys(self, out: dict) -> None:
        prompts = self._rows_per_step()
        out["rollout"] = {
            "group_size": self.num_generations,
            "prompts_per_step": prompts,
            "max_new_tokens": self.max_completion_length,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "epochs": self.num_iterations,
            "mask_truncated": self.mask_truncated_completions,
            "advantage_scale": _advantage_scale(self.scale_rewards),
        }
        out["data"] = {"max_length": self.max_prompt_length}
        out["eval"] = {
            "every": self.eval_steps,
            "num_samples": self.eval_num_samples,
            "pass_at": list(self.pass_at),
            "maj_at": list(self.maj_at),
        }
        loss: dict[str, Any] = {}
        if self.beta is not None:
            loss[self.beta_key] = self.beta
        if self.epsilon is not None:
            loss["clip_eps"] = self.epsilon
        if loss:
            out["loss"] = loss


@dataclasses.dataclass(kw_only=True)
class RLOOConfig(GRPOConfig):
    """RLOO (``algorithm: rloo``): :class:`GRPOConfig`'s fields."""

    algorithm: ClassVar[str] = "rloo"


@dataclasses.dataclass(kw_only=True)
class OnlineDPOConfig(GRPOConfig):
    """Online DPO (``algorithm: online_dpo``): :class:`GRPOConfig`'s fields; ``beta`` is the
    DPO β (``loss.beta``)."""

    algorithm: ClassVar[str] = "online_dpo"
    beta_key: ClassVar[str] = "beta"


@dataclasses.dataclass(kw_only=True)
class SFTConfig(TrainingConfig):
    """Supervised fine-tuning (``algorithm: sft``) by TRL's ``SFTConfig`` names; the shared
    fields are :class:`TrainingConfig`'s.

    Attributes:
      max_length: tokens per example (``data.max_length``).
      packing: pack examples into full rows (``data.packing``).
      batch_size: rows per step (``train.batch_size``), when ``per_device_train_batch_size``
        is not given (then it is that × devices × ``gradient_accumulation_steps``, split into
        ``gradient_accumulation_steps`` micro-batches).
    """

    algorithm: ClassVar[str] = "sft"

    max_length: int = 512
    packing: bool = False
    batch_size: int = 8

    def _rows_per_step(self) -> int:
        """Rows per step: ``batch_size``, or the global batch."""
        rows = self._global_batch()
        return self.batch_size if rows is None else rows

    def _algorithm_keys(self, out: dict) -> None:
        out["train"] = {
            "batch_size": self._rows_per_step(),
            "micro_batches": self.gradient_accumulation_steps,
            "eval_every": self.eval_steps,
        }
        out["data"] = {"max_length": self.max_length, "packing": self.packing}


@dataclasses.dataclass(kw_only=True)
class DPOConfig(SFTConfig):
    """DPO (``algorithm: dpo``): :class:`SFTConfig`'s fields and ``beta``, the DPO β
    (``loss.beta``; None: the default)."""

    algorithm: ClassVar[str] = "dpo"
    beta: float | None = None

    def _algorithm_keys(self, out: dict) -> None:
        super()._algorithm_keys(out)
        if self.beta is not None:
            out["loss"] = {"beta": self.beta}


@dataclasses.dataclass(kw_only=True)
class KTOConfig(DPOConfig):
    """KTO (``algorithm: kto``): :class:`DPOConfig`'s fields."""

    algorithm: ClassVar[str] = "kto"


@dataclasses.dataclass(kw_only=True)
class ORPOConfig(DPOConfig):
    """ORPO (``algorithm: orpo``): :class:`DPOConfig`'s fields (``beta`` is ORPO's λ)."""

    algorithm: ClassVar[str] = "orpo"


@dataclasses.dataclass(kw_only=True)
class RewardConfig(SFTConfig):
    """A reward model (``algorithm: reward_model``): :class:`SFTConfig`'s fields."""

    algorithm: ClassVar[str] = "reward_model"


def _shared_fields_doc() -> str:
    """The ``Attributes`` section of :class:`TrainingConfig`'s docstring."""
    doc = TrainingConfig.__doc__ or ""
    return doc[doc.index("    Attributes:") :].replace("Attributes:", "Shared attributes:", 1)


#: The typed configs by algorithm.
CONFIGS: dict[str, type[TrainingConfig]] = {
    c.algorithm: c
    for c in (
        GRPOConfig,
        RLOOConfig,
        OnlineDPOConfig,
        SFTConfig,
        DPOConfig,
        KTOConfig,
        ORPOConfig,
        RewardConfig,
    )
}


def _merge(base: dict, over: Mapping[str, Any]) -> dict:
    """``over`` merged into ``base``, section by section."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


for _cls in CONFIGS.values():  # help() on a config lists the shared fields too
    _cls.__doc__ = (_cls.__doc__ or "").rstrip() + "\n\n" + _shared_fields_doc()
    checked_init(_cls)  # TRL names this package lacks, unknown keywords: one line each
checked_init(TrainingConfig)
