"""Shared run set-up for the offline and online trainers: model + tokenizer, mesh, optimizer,
the sharded train state (full fine-tuning or LoRA), and the policy's ``apply_fn``.

Full fine-tuning trains the whole parameter tree. With LoRA the train state holds only the
adapters; the base weights are a frozen argument of every step (``frozen={"base": ...}``) and
double as the reference model (adapters off), so the weights exist once.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm import models
from jaxrl_llm.errors import ConfigError, DataError, ModelLoadError
from jaxrl_llm.models.lora import (LoRAConfig, attach_lora, init_lora, lora_logical_axes,
                                   merge_lora)
from jaxrl_llm.parallel import DEFAULT_RULES, logical_to_sharding, make_mesh, replicated
from jaxrl_llm.train.run_config import RunConfig
from jaxrl_llm.train.state import TrainState, state_sharding_from_params

# LoRA adapters are small: replicate them (their base kernels carry the sharding).
RULES = {**DEFAULT_RULES, "lora_in": None, "lora_out": None, "lora_rank": None}


@dataclasses.dataclass
class Policy:
    """Everything a trainer needs about the model being trained.

    Attributes:
      config: the model config. tokenizer: its tokenizer (with chat template).
      mesh: the device mesh. base: the frozen base params (LoRA) or None.
      lora: the LoRA config or None. state / state_sharding: the sharded TrainState.
      apply_fn: ``apply_fn(params, input_ids, attention_mask=..., ...)`` -> ModelOutputs.
      optimizer: the optax transformation.
    """

    config: models.ModelConfig
    tokenizer: Any
    mesh: jax.sharding.Mesh
    base: Any
    lora: LoRAConfig | None
    state: TrainState
    state_sharding: TrainState
    apply_fn: Callable
    optimizer: optax.GradientTransformation
    param_sharding: Any
    frozen_sharding: dict

    def full_params(self, params=None):
        """The model's parameter tree for sampling / evaluation / export (adapters merged)."""
        params = self.state.params if params is None else params
        if self.lora is None:
            return params
        return _merge_jit(self.base, params, self.lora)

    def reference_params(self):
        """The frozen reference: the base (LoRA) — for full fine-tuning the caller keeps a copy."""
        return self.base

    def loss_fn(self, loss, *, loss_config):
        """Bind a registry loss to this policy: ``fn(params, batch, **frozen)`` for the step.

        With LoRA the trainable params are the adapters, attached unmerged to
        ``frozen["base"]`` (:func:`models.lora.attach_lora`: no full-size weight gradients).
        """
        if self.lora is None:
            def fn(params, batch, **frozen):
                return loss(params, batch, apply_fn=self.apply_fn, config=loss_config)
        else:
            lora = self.lora

            def fn(adapters, batch, *, base, **frozen):
                return loss(attach_lora(base, adapters, lora), batch, apply_fn=self.apply_fn,
                            config=loss_config)
        return fn


@functools.partial(jax.jit, static_argnames=("lora",))
def _merge_jit(base, adapters, lora):
    return merge_lora(base, adapters, lora)


def load_policy_model(cfg: RunConfig):
    """(ModelConfig, params as numpy/jax arrays, tokenizer) for ``cfg.model``."""
    m = cfg.model
    if m.source == "tiny":
        from jaxrl_llm.data import CharTokenizer

        tok = CharTokenizer()
        overrides = dict(vocab_size=tok.vocab_size, eos_token_ids=(tok.eos_token_id,),
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         param_dtype=m.param_dtype, compute_dtype=m.compute_dtype)
        allowed = sorted(f.name for f in dataclasses.fields(models.ModelConfig))
        unknown = sorted(set(m.tiny or {}) - set(allowed))
        if unknown:
            raise ConfigError(f"model.tiny: unknown key(s) {unknown}; allowed: {allowed}")
        overrides.update(m.tiny or {})
        try:
            config = models.ModelConfig.tiny(**overrides)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"model.tiny: {e}") from None
        check_vocab(config, tok, source="model.source=tiny", tokenizer_name="model.tokenizer=char",
                    fix="set model.tiny.vocab_size >= that (or leave it out)")
        params = models.init_params(config, jax.random.PRNGKey(cfg.seed))
        return config, params, tok
    from jaxrl_llm.interop import load_model

    loaded = load_model(m.source, param_dtype="float32", compute_dtype=m.compute_dtype)
    tok = loaded.tokenizer
    if m.tokenizer == "char":
        from jaxrl_llm.data import CharTokenizer
        tok = CharTokenizer()
    if tok is None:
        raise ConfigError(f"model.source={m.source!r} has no tokenizer; set model.tokenizer")
    check_vocab(loaded.config, tok, source=f"model.source={m.source!r}",
                tokenizer_name=f"model.tokenizer={m.tokenizer}")
    return loaded.config, loaded.params, tok


def tokenizer_size(tokenizer) -> int | None:
    """How many token ids ``tokenizer`` can produce (``len()`` of a transformers tokenizer,
    which counts added tokens; ``vocab_size`` otherwise), or None when it does not say."""
    try:
        return int(len(tokenizer))
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        return None if size is None else int(size)


def check_vocab(config: models.ModelConfig, tokenizer, *, source: str,
                tokenizer_name: str = "its tokenizer",
                fix: str = "use the tokenizer that belongs to this model") -> None:
    """A tokenizer must not produce ids the model's embedding table does not have (a gather
    past the table is clamped silently on accelerators, so the run would train on garbage)."""
    n = tokenizer_size(tokenizer)
    if n is not None and n > config.vocab_size:
        raise ModelLoadError(f"{source}: {tokenizer_name} has {n} tokens but the model's "
                             f"vocabulary has {config.vocab_size} (vocab_size); {fix}")


def make_optimizer(cfg: RunConfig) -> optax.GradientTransformation:
    """optax optimizer with the configured schedule (gradient clipping lives in the step)."""
    o = cfg.optim
    total = max(cfg.max_steps * _updates_per_step(cfg), 1)
    warm = min(o.warmup_steps, total)
    if o.schedule == "constant":
        sched = optax.constant_schedule(o.lr)
    elif o.schedule == "cosine":
        sched = optax.cosine_decay_schedule(o.lr, max(total - warm, 1))
    else:
        sched = optax.linear_schedule(o.lr, 0.0, max(total - warm, 1))
    if warm:
        sched = optax.join_schedules([optax.linear_schedule(0.0, o.lr, warm), sched], [warm])
    if o.name == "adamw":
        return optax.adamw(sched, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)
    if o.name == "adam":
        return optax.adam(sched, b1=o.b1, b2=o.b2, eps=o.eps)
    return optax.sgd(sched)


def _updates_per_step(cfg: RunConfig) -> int:
    if cfg.is_online:
        return cfg.rollout.epochs * cfg.rollout.minibatches
    return 1


def _freeze_embeddings(optimizer, params):
    labels = jax.tree_util.tree_map_with_path(
        lambda path, _: "frozen" if "embed" in jax.tree_util.keystr(path) else "train", params)
    return optax.multi_transform({"train": optimizer, "frozen": optax.set_to_zero()}, labels)


def build_policy(cfg: RunConfig, *, config=None, params=None, tokenizer=None) -> Policy:
    """Load the model, build the mesh, optimizer and the sharded train state."""
    if config is None:
        config, params, tokenizer = load_policy_model(cfg)
    mesh = make_mesh(data=cfg.mesh.data, fsdp=cfg.mesh.fsdp, tensor=cfg.mesh.tensor)
    optimizer = make_optimizer(cfg)
    axes = models.param_logical_axes(config)
    param_sharding_full = logical_to_sharding(axes, mesh, RULES, shapes=params)
    params = jax.device_put(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params),
                            param_sharding_full)
    apply_fn = functools.partial(models.apply, config=config, remat=cfg.model.remat)
    rng = jax.random.PRNGKey(cfg.seed)
    lora = None
    base = None
    frozen_sharding: dict = {}
    if cfg.model.lora is not None:
        lc = cfg.model.lora
        try:
            lora = LoRAConfig(rank=lc.rank, alpha=lc.alpha, targets=lc.targets)
        except ValueError as e:
            raise ConfigError(f"model.lora: {e}") from None
        base = params
        trainable = init_lora(config, lora, jax.random.fold_in(rng, 1))
        param_sharding = logical_to_sharding(lora_logical_axes(lora), mesh, RULES,
                                             shapes=trainable)
        trainable = jax.device_put(trainable, param_sharding)
        frozen_sharding = {"base": param_sharding_full}
    else:
        trainable = params
        param_sharding = param_sharding_full
        if cfg.model.freeze_embeddings:
            optimizer = _freeze_embeddings(optimizer, params)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), trainable)
    state_sharding = state_sharding_from_params(optimizer, abstract, param_sharding, mesh)
    opt_state = jax.jit(optimizer.init, out_shardings=state_sharding.opt_state)(trainable)
    state = TrainState(params=trainable, opt_state=opt_state,
                       step=jax.device_put(jnp.zeros((), jnp.int32), replicated(mesh)),
                       rng=jax.device_put(jax.random.fold_in(rng, 2), replicated(mesh)))
    return Policy(config=config, tokenizer=tokenizer, mesh=mesh, base=base, lora=lora,
                  state=state, state_sharding=state_sharding, apply_fn=apply_fn,
                  optimizer=optimizer, param_sharding=param_sharding,
                  frozen_sharding=frozen_sharding)


def export_policy(policy: Policy, cfg: RunConfig) -> str | None:
    """Write the trained policy (LoRA adapters merged) as a Hugging Face directory."""
    if jax.process_index() != 0:
        return None
    from jaxrl_llm.interop import export_hf

    out = os.path.join(cfg.output_dir, "hf")
    tok = policy.tokenizer if hasattr(policy.tokenizer, "save_pretrained") else None
    export_hf(out, config=policy.config, params=jax.device_get(policy.full_params()),
              tokenizer=tok)
    return out


def make_checkpointer(cfg: RunConfig, policy: Policy, *, subdir: str = "checkpoints"):
    """The run's orbax CheckpointManager under ``output_dir/<subdir>`` (model config and
    tokenizer saved alongside, so ``jaxrl-llm convert`` works from it)."""
    from jaxrl_llm.train.checkpoint import CheckpointManager

    tok = policy.tokenizer if hasattr(policy.tokenizer, "save_pretrained") else None
    return CheckpointManager(os.path.join(cfg.output_dir, subdir),
                             save_every=cfg.checkpoint.save_every or 10 ** 9,
                             keep=cfg.checkpoint.keep, model_config=policy.config,
                             tokenizer=tok)


def restore_latest(ckpt, policy: Policy, step: int | None = None) -> dict | None:
    """Restore the newest finalised checkpoint (or ``step``) into ``policy.state`` (same
    shardings); returns its ``extra`` dict, or None when there is no checkpoint."""
    if ckpt.latest_step() is None:
        return None
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            policy.state)
    policy.state, extra = ckpt.restore(abstract, step)
    return extra


def make_logger(cfg: RunConfig, *, progress_keys, stream, resumed: dict | None):
    """The run's MetricsLogger (metrics.jsonl, TensorBoard, W&B; main process only).

    ``resumed`` is the ``extra`` dict of the checkpoint the run resumed from (None for a fresh
    run): its ``metrics_rows`` (see :func:`run_extra`) says how many rows of ``metrics.jsonl``
    to keep, and its ``step`` which TensorBoard events to purge, so rows logged after that
    checkpoint by a killed run are not duplicated.
    """
    from jaxrl_llm.train.config_io import to_dict
    from jaxrl_llm.train.logging import MetricsLogger

    return MetricsLogger(cfg.output_dir, total_steps=cfg.max_steps,
                         tensorboard=cfg.logging.tensorboard,
                         wandb_project=cfg.logging.wandb_project,
                         is_main_process=jax.process_index() == 0, progress_keys=progress_keys,
                         stream=stream, config=to_dict(cfg), resume=resumed is not None,
                         keep_rows=None if resumed is None else resumed.get("metrics_rows"),
                         resume_step=None if resumed is None else resumed.get("step"))


def run_extra(step: int, *, iterator, logger, guard: "NonFiniteGuard",
              train_time_s: float) -> dict:
    """The JSON ``extra`` a trainer saves with each checkpoint: everything besides the train
    state that a resumed run needs to continue exactly as an uninterrupted one (data position,
    rows of ``metrics.jsonl`` logged so far, the non-finite guard's count, training time)."""
    return {"step": int(step), "data": iterator.state(),
            "metrics_rows": None if logger is None else logger.rows,
            "nonfinite_steps_total": guard.total, "train_time_s": float(train_time_s)}


class NonFiniteGuard:
    """Counts consecutive steps whose update the train step skipped (NaN/Inf loss or gradient)
    and stops the run after ``limit`` of them, naming the last good checkpoint."""

    def __init__(self, limit: int, ckpt):
        self.limit = max(int(limit), 1)
        self.ckpt = ckpt
        self.consecutive = 0
        self.total = 0

    def restore(self, extra: dict) -> None:
        """Continue the count of a resumed run (from its checkpoint's :func:`run_extra`);
        periodic checkpoints follow good steps only, so ``consecutive`` restarts at 0."""
        self.total = int(extra.get("nonfinite_steps_total", 0))

    def update(self, step: int, nonfinite: float) -> dict:
        """Record one step's ``nonfinite`` flag; returns the metrics to log."""
        if nonfinite:
            self.consecutive += 1
            self.total += 1
        else:
            self.consecutive = 0
        return {"nonfinite_steps_total": self.total}

    def check(self, step: int) -> None:
        """Raise TrainingError after ``limit`` bad steps in a row (call after logging)."""
        from jaxrl_llm.errors import TrainingError

        if self.consecutive >= self.limit:
            self.ckpt.wait_until_finished()  # an async save of the last good step may be pending
            last = self.ckpt.latest_step()
            where = (f"the last good checkpoint (step {last}) in {self.ckpt.directory} is intact"
                     if last is not None else "no checkpoint was written")
            raise TrainingError(f"step {step}: {self.consecutive} consecutive steps with a "
                                f"non-finite loss or gradient (updates skipped); stopping — "
                                f"{where}. Lower optim.lr or check the data and rewards.")


def check_batch_divisible(mesh, rows: int, what: str) -> None:
    """A batch of ``rows`` rows must split evenly over the mesh's data × fsdp axes.

    ``mesh`` is a ``Mesh`` or a ``{"data": n, "fsdp": n, ...}`` dict of axis sizes.
    """
    shape = mesh if isinstance(mesh, dict) else mesh.shape
    shards = shape["data"] * shape["fsdp"]
    if rows % shards:
        raise ConfigError(f"{what}={rows} rows cannot be split over the mesh's data x fsdp = "
                          f"{shards} devices; use a multiple of {shards} or set mesh.data / "
                          f"mesh.fsdp")


def check_mesh(cfg: RunConfig, num_devices: int | None = None, *,
               mesh=None) -> dict[str, int]:
    """Resolve ``cfg.mesh`` for ``num_devices`` (default: every device) and check that each
    step's batch splits over it — before any model is loaded, and by ``train --dry-run``.

    With ``mesh`` (the mesh of a policy built elsewhere), its axis sizes are checked instead
    of ``cfg.mesh``'s.

    Returns:
      the axis sizes ``{"data", "fsdp", "tensor"}``.
    Raises:
      ConfigError: the sizes do not fit the device count, or the batch rows do not split.
    """
    from jaxrl_llm.parallel.mesh import mesh_shape

    if mesh is not None:
        sizes = {k: int(mesh.shape[k]) for k in ("data", "fsdp", "tensor")}
    else:
        n = jax.device_count() if num_devices is None else num_devices
        sizes = dict(zip(("data", "fsdp", "tensor"),
                         mesh_shape(n, data=cfg.mesh.data, fsdp=cfg.mesh.fsdp,
                                    tensor=cfg.mesh.tensor)))
    r, t = cfg.rollout, cfg.train
    if cfg.algorithm == "online_dpo":
        check_batch_divisible(sizes, r.prompts_per_step, "rollout.prompts_per_step (pairs)")
    elif cfg.is_online:
        check_batch_divisible(sizes, r.prompts_per_step * r.group_size // r.minibatches,
                              "rollout.prompts_per_step x group_size / minibatches")
    else:
        check_batch_divisible(sizes, t.batch_size // t.micro_batches,
                              "train.batch_size / train.micro_batches")
    return sizes


def host_numpy(tree):
    """Device arrays -> numpy (for logging / host-side reward code)."""
    return jax.tree.map(np.asarray, tree)


def read_splits(cfg: RunConfig, fmt, tokenizer, *, per_step: int, per_step_key: str, unit: str):
    """The tokenised training and held-out sets of ``cfg.data`` (held-out None without
    ``data.eval``), read before anything compiles so that a bad line costs no compile.

    Raises:
      DataError: the training set (after ``data.length_policy``) cannot fill one step of
        ``per_step`` examples per host (``per_step_key`` names the setting, ``unit`` the
        examples: "examples", "prompts").
    """
    from jaxrl_llm.data import prepare_dataset

    d = cfg.data
    train = prepare_dataset(d.train, fmt, tokenizer, max_len=d.max_length,
                            length_policy=d.length_policy)
    held_out = (prepare_dataset(d.eval, fmt, tokenizer, max_len=d.max_length,
                                length_policy=d.length_policy) if d.eval else None)
    hosts = jax.process_count()
    if len(train.items) < per_step * hosts:
        raise DataError(f"{d.train}: {len(train.items)} {unit} (after data.length_policy="
                        f"{d.length_policy}) cannot fill one step of {per_step_key}={per_step}"
                        + (f" x {hosts} hosts" if hosts > 1 else "")
                        + f"; add {unit} or lower {per_step_key}")
    return train, held_out
