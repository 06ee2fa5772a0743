"""The model being trained: load it, build the mesh, the optimizer and the sharded train state
(full fine-tuning or LoRA), bind a loss to it, export it.

Full fine-tuning trains the whole parameter tree. With LoRA the train state holds only the
adapters; the base weights are a frozen argument of every step (``frozen={"base": ...}``) and
double as the reference model (adapters off), so the weights exist once.

A mixture of experts runs expert-parallel over the mesh's ``expert`` axis (the mesh is bound
into ``apply_fn``), and :meth:`Policy.loss_fn` adds its load-balancing loss to the training
loss (``model.router_aux_loss_coef``; metric ``moe/aux_loss``). When the learner batch holds
the sampler's recorded routing (``routing``; ``rollout.routing_replay`` / ``record_routing``),
the policy's forwards in the loss and the correction's recompute receive it
(:class:`~jaxrl_llm.models.RecordedRouting`): replayed with ``rollout.routing_replay`` (R3,
Ma et al. 2025, https://arxiv.org/abs/2510.11370), compared against otherwise; metrics
``routing/mismatch_frac`` and ``routing/own_topk_mismatch_frac``.

With ``mesh.context: C > 1`` the mesh is bound into ``apply_fn`` too
(:func:`jaxrl_llm.parallel.under_mesh`): every forward of the policy traced under jit (the
loss's, a reference's, a recompute's) runs its self-attention as ring attention over the
``context`` axis when its T is a multiple of C (Liu et al. 2023,
https://arxiv.org/abs/2310.01889), and as one attention over the whole row otherwise. The
samplers do not use ``apply_fn``: the rollout runs unsharded along T.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm import models
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.models import quant
from jaxrl_llm.models.lora import LoRAConfig, attach_lora, init_lora, lora_logical_axes, merge_lora
from jaxrl_llm.parallel import (
    DEFAULT_RULES,
    context_size,
    logical_to_sharding,
    make_mesh,
    replicated,
    split_devices,
    to_host,
    under_mesh,
)
from jaxrl_llm.train.config.plan import RunPlan, plan_run
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.programs.model_load import (  # noqa: F401  (re-exported: loading)
    check_vocab,
    load_policy_model,
    tokenizer_size,
)
from jaxrl_llm.train.programs.state import TrainState, state_sharding_from_params

# LoRA adapters are small: replicate them (their base kernels carry the sharding).
RULES = {**DEFAULT_RULES, "lora_in": None, "lora_out": None, "lora_rank": None}


@dataclasses.dataclass
class Policy:
    """Everything a trainer needs about the model being trained.

    Attributes:
      config: the model config. tokenizer: its tokenizer (with chat template).
      mesh: the device mesh. base: the frozen base params (LoRA; stored as
        ``model.lora.base_dtype``, quantised with int8 / nf4) or None.
      lora: the LoRA config or None. state / state_sharding: the sharded TrainState.
      apply_fn: ``apply_fn(params, input_ids, attention_mask=..., ...)`` -> ModelOutputs.
      optimizer: the optax transformation.
      router_aux_weight: what :meth:`loss_fn` multiplies a mixture of experts' load-balancing
        loss by per loss call: α / M, α the run's coefficient and M the micro-batches a step
        sums (each micro-batch's loss is a share of the step's, so the step adds α × the mean
        of the micro-batches' aux losses; a skipped micro-batch adds none). 0 for dense models.
      lr_schedule: the optimizer's learning-rate schedule (update count -> lr).
      routing_replay: a mixture of experts: the policy's forwards route each token to the
        experts of the batch's ``routing`` (rollout routing replay) instead of comparing
        their own top-k with them (``rollout.routing_replay``).
      full_sharding: the sharding of the float parameter tree (:meth:`full_shapes`).
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
    router_aux_weight: float = 0.0
    lr_schedule: Callable[[Any], Any] | None = None
    routing_replay: bool = False
    full_sharding: Any = None

    def full_shapes(self):
        """The tree :meth:`full_params` returns, as arrays or ``ShapeDtypeStruct``s with their
        shardings (``jaxrl-llm compile``'s sampler copy): with a quantised LoRA base
        (``model.lora.base_dtype`` int8 / nf4) the bfloat16 tree it dequantises to."""
        if self.lora is None:
            return self.state.params
        if self.lora.base_dtype not in quant.QUANTIZED:
            return self.base
        shapes = jax.eval_shape(quant.dequantize_base, self.base)
        return _with_shardings(shapes, self.full_sharding)

    def learning_rate(self) -> float:
        """The learning rate of the last optimizer update (:func:`lr_schedule` at the state's
        update count − 1; the first update's before any)."""
        assert self.lr_schedule is not None
        return float(self.lr_schedule(max(int(self.state.step) - 1, 0)))

    def full_params(self, params=None):
        """The model's parameter tree for sampling / evaluation / export (adapters merged)."""
        params = self.state.params if params is None else params
        if self.lora is None:
            return params
        return _merge_jit(self.base, params, self.lora)

    def frozen(self) -> dict:
        """The frozen arguments of every train step: ``{"base": params}`` with LoRA, else ``{}``."""
        return {"base": self.base} if self.lora is not None else {}

    def reference_params(self):
        """A frozen reference policy: the base weights (adapters off) with LoRA, a copy of the
        current weights otherwise."""
        if self.lora is not None:
            return self.base
        return jax.tree.map(jnp.copy, self.state.params)

    def loss_fn(self, loss, *, loss_config, logprobs=None):
        """Bind a registry loss to this policy: ``fn(params, batch, *, hparams=None,
        **frozen)`` for the step (``hparams``: traced hyperparameters, forwarded only when
        given).

        With LoRA the trainable params are the adapters, attached unmerged to
        ``frozen["base"]`` (:func:`models.lora.attach_lora`: no full-size weight gradients).

        Frozen models other than ``base`` (``teacher``: GKD's teacher weights) are passed to
        the loss as keyword arguments.

        A mixture of experts: the loss's forwards of the trained params report their
        load-balancing loss (``ModelOutputs.router_aux_loss``); their mean ``aux`` is logged
        as ``moe/aux_loss`` and ``router_aux_weight · aux`` is added to the loss. Forwards of
        frozen models inside the loss (a reference) are not counted. With the sampler's
        routing in the batch (``batch["routing"]`` ``[B, T, L, k]``) those forwards replay it
        or compare against it (:attr:`routing_replay`); the mean fractions of routing
        decisions that differ from it are logged as ``routing/mismatch_frac`` (the experts
        used: 0 under replay) and ``routing/own_topk_mismatch_frac`` (the forward's own top-k).
        """
        kw: dict[str, Any] = {"apply_fn": self.apply_fn, "config": loss_config}
        if logprobs is not None:
            kw["logprobs"] = logprobs
        lora = self.lora
        moe, aux_weight, apply_fn = self.config.is_moe, self.router_aux_weight, self.apply_fn
        replay = self.routing_replay

        def fn(params, batch, *, hparams=None, base=None, **frozen):
            if lora is not None:
                params = attach_lora(base, params, lora)
            # other frozen models (a distillation teacher) are the loss's own arguments
            extra = dict(frozen) if hparams is None else {"hparams": hparams, **frozen}
            if not moe:
                return loss(params, batch, **kw, **extra)
            aux_terms: list[jax.Array] = []
            differ: list[tuple[jax.Array, jax.Array]] = []
            recorded = _recorded_routing(batch, replay)

            def recording_apply(p, *args, **kwargs):
                if p is params and recorded is not None:
                    kwargs = {**kwargs, "routing": recorded}
                out = apply_fn(p, *args, **kwargs)
                if p is params and out.router_aux_loss is not None:
                    aux_terms.append(out.router_aux_loss)
                if p is params and out.routing_mismatch is not None:
                    differ.append((out.routing_mismatch, out.routing_own_mismatch))
                return out

            value, metrics = loss(params, batch, **{**kw, "apply_fn": recording_apply}, **extra)
            if differ:
                metrics = {
                    **metrics,
                    "routing/mismatch_frac": sum(d[0] for d in differ) / len(differ),
                    "routing/own_topk_mismatch_frac": sum(d[1] for d in differ) / len(differ),
                }
            if not aux_terms:
                return value, metrics
            aux = sum(aux_terms) / len(aux_terms)
            return value + aux_weight * aux, {**metrics, "moe/aux_loss": aux}

        return fn

    def logps_fn(
        self, logps: Callable[..., jax.Array], *, wrap: Callable | None = None
    ) -> Callable[..., jax.Array]:
        """Jitted ``fn(params, batch, **frozen) -> [B, T]`` of ``logps(params, batch, *,
        apply_fn)`` (e.g. ``losses.sequence_logps`` with the run's log-prob settings), the
        model bound as in :meth:`loss_fn` (LoRA attached unmerged): the numbers the update's
        own forward computes, before the update. ``wrap``: applied to ``fn`` before jit
        (e.g. :func:`jaxrl_llm.train.programs.builder.forward_under_mesh`). A batch with the
        sampler's ``routing`` is replayed (or compared against) as in :meth:`loss_fn`."""
        apply_fn, lora = self.apply_fn, self.lora
        moe, replay = self.config.is_moe, self.routing_replay

        def fn(params, batch, *, base=None):
            if lora is not None:
                params = attach_lora(base, params, lora)
            recorded = _recorded_routing(batch, replay) if moe else None
            af = apply_fn if recorded is None else functools.partial(apply_fn, routing=recorded)
            return jax.lax.stop_gradient(logps(params, batch, apply_fn=af))

        return jax.jit(fn if wrap is None else wrap(fn))


def _recorded_routing(batch: Any, replay: bool) -> models.RecordedRouting | None:
    """The sampler's routing of a learner batch for the policy's forwards, replayed or only
    compared against: its ``routing`` entry, or a preference batch's ``chosen_routing`` and
    ``rejected_routing`` stacked as the pair forward stacks the rows
    (:func:`jaxrl_llm.losses.common.stack_pair`: chosen, then rejected); None without."""
    if not hasattr(batch, "get"):
        return None
    routing = batch.get("routing")
    if routing is None and batch.get("chosen_routing") is not None:
        routing = jnp.concatenate([batch["chosen_routing"], batch["rejected_routing"]], axis=0)
    return None if routing is None else models.RecordedRouting(routing, replay=replay)


@functools.partial(jax.jit, static_argnames=("lora",))
def _merge_jit(base, adapters, lora):
    return merge_lora(base, adapters, lora)


def lr_schedule(cfg: RunConfig, updates_per_step: int = 1) -> optax.Schedule:
    """The learning rate at each optimizer update: ``optim.schedule`` (constant, cosine or
    linear decay to 0) over ``max_steps × updates_per_step`` updates, after
    ``optim.warmup_steps`` updates of linear warm-up from 0."""
    o = cfg.optim
    total = max(cfg.max_steps * updates_per_step, 1)
    warm = min(o.warmup_steps, total)
    if o.schedule == "constant":
        sched = optax.constant_schedule(o.lr)
    elif o.schedule == "cosine":
        sched = optax.cosine_decay_schedule(o.lr, max(total - warm, 1))
    else:
        sched = optax.linear_schedule(o.lr, 0.0, max(total - warm, 1))
    if warm:
        sched = optax.join_schedules([optax.linear_schedule(0.0, o.lr, warm), sched], [warm])
    return sched


def make_optimizer(
    cfg: RunConfig, schedule: optax.Schedule | None = None
) -> optax.GradientTransformation:
    """Optax optimizer with the learning-rate ``schedule`` (default :func:`lr_schedule` with
    one update per step; gradient clipping lives in the step)."""
    o = cfg.optim
    sched = lr_schedule(cfg) if schedule is None else schedule
    if o.name == "adamw":
        return optax.adamw(sched, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)
    if o.name == "adam":
        return optax.adam(sched, b1=o.b1, b2=o.b2, eps=o.eps)
    return optax.sgd(sched)


def _freeze_embeddings(optimizer, params):
    labels = jax.tree_util.tree_map_with_path(
        lambda path, _: "frozen" if "embed" in jax.tree_util.keystr(path) else "train", params
    )
    return optax.multi_transform({"train": optimizer, "frozen": optax.set_to_zero()}, labels)


def learner_mesh(cfg: RunConfig) -> jax.sharding.Mesh:
    """The learner's device mesh: ``cfg.mesh`` over every device, or over those that
    ``rollout.devices`` leaves it (the last n devices sample, :mod:`jaxrl_llm.train.online.placement`)."""
    learner_devices = None
    if cfg.is_online and cfg.rollout.devices:
        learner_devices, _ = split_devices(cfg.rollout.devices)
    return make_mesh(
        devices=learner_devices,
        data=cfg.mesh.data,
        fsdp=cfg.mesh.fsdp,
        tensor=cfg.mesh.tensor,
        expert=cfg.mesh.expert,
        context=cfg.mesh.context,
    )


def build_policy(
    cfg: RunConfig, *, config=None, params=None, tokenizer=None, plan: RunPlan | None = None
) -> Policy:
    """Load the model (unless ``config`` / ``params`` are given), build the learner mesh, the
    optimizer and the sharded train state (:func:`policy_on_mesh`). ``plan``: the run's plan
    (resolved here for the mesh when not given)."""
    if config is None:
        config, params, tokenizer = load_policy_model(cfg)
    mesh = learner_mesh(cfg)
    plan = plan or plan_run(cfg, mesh)
    return policy_on_mesh(
        cfg,
        config,
        mesh,
        params=params,
        tokenizer=tokenizer,
        micro_batches=plan.rows.micro_batches,
        updates_per_step=plan.rows.epochs * plan.rows.minibatches,
    )


def policy_on_mesh(
    cfg: RunConfig,
    config: models.ModelConfig,
    mesh: jax.sharding.Mesh,
    *,
    params: Any = None,
    tokenizer: Any = None,
    micro_batches: int = 1,
    updates_per_step: int = 1,
) -> Policy:
    """The :class:`Policy` of ``config`` on ``mesh``: parameters sharded by the rule table,
    the optimizer and its sharded state, ``apply_fn`` bound to the mesh (experts over
    ``expert``, ring attention over ``context``), LoRA adapters when ``cfg.model.lora``.

    With ``params`` None the policy is abstract: every parameter, adapter and optimizer
    moment a ``ShapeDtypeStruct`` carrying its sharding, nothing allocated — what ``jaxrl-llm
    compile`` lowers the trainers' programs with (:mod:`jaxrl_llm.train.compile.aot`).

    Args:
      micro_batches: the micro-batches one train step sums (:attr:`RunPlan.rows`), for the
        mixture-of-experts auxiliary loss's weight (:func:`router_aux_weight`).
      updates_per_step: optimizer updates per train step (epochs × minibatches), for the
        learning-rate schedule's length (:func:`lr_schedule`).
    """
    abstract = params is None
    schedule = lr_schedule(cfg, updates_per_step)
    optimizer = make_optimizer(cfg, schedule)
    axes = models.param_logical_axes(config)
    if abstract:
        params = jax.eval_shape(
            functools.partial(models.init_params, config), jax.random.PRNGKey(0)
        )
    param_sharding_full = logical_to_sharding(axes, mesh, RULES, shapes=params)
    if abstract:
        params = _with_shardings(params, param_sharding_full, jnp.float32)
    else:
        params = jax.device_put(
            jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params), param_sharding_full
        )
    apply_fn = functools.partial(models.apply, config=config, remat=cfg.model.remat)
    if config.is_moe:  # the experts run split over the mesh's expert axis
        apply_fn = functools.partial(apply_fn, mesh=mesh)
    if context_size(mesh) > 1:  # attention round the ring over the context axis
        apply_fn = under_mesh(apply_fn, mesh)
    rng = jax.random.PRNGKey(cfg.seed)
    lora = None
    base = None
    frozen_sharding: dict = {}
    if cfg.model.lora is not None:
        lc = cfg.model.lora
        try:
            lora = LoRAConfig(
                rank=lc.rank, alpha=lc.alpha, targets=lc.targets, base_dtype=lc.base_dtype
            )
        except ValueError as e:
            raise ConfigError(f"model.lora: {e}") from None
        base, base_sharding = frozen_base(params, axes, mesh, lora.base_dtype, abstract=abstract)
        init = functools.partial(init_lora, config, lora)
        trainable = jax.eval_shape(init, rng) if abstract else init(jax.random.fold_in(rng, 1))
        param_sharding = logical_to_sharding(lora_logical_axes(lora), mesh, RULES, shapes=trainable)
        trainable = (
            _with_shardings(trainable, param_sharding)
            if abstract
            else jax.device_put(trainable, param_sharding)
        )
        frozen_sharding = {"base": base_sharding}
    else:
        trainable = params
        param_sharding = param_sharding_full
        if cfg.model.freeze_embeddings:
            optimizer = _freeze_embeddings(optimizer, params)
    state, state_sharding = _initial_state(
        optimizer, trainable, param_sharding, mesh, rng, abstract=abstract
    )
    return Policy(
        config=config,
        tokenizer=tokenizer,
        mesh=mesh,
        base=base,
        lora=lora,
        state=state,
        state_sharding=state_sharding,
        apply_fn=apply_fn,
        optimizer=optimizer,
        param_sharding=param_sharding,
        frozen_sharding=frozen_sharding,
        router_aux_weight=router_aux_weight(cfg, config, micro_batches),
        lr_schedule=schedule,
        routing_replay=cfg.is_online and cfg.rollout.routing_replay,
        full_sharding=param_sharding_full,
    )


def frozen_base(
    params: Any, axes: Any, mesh: jax.sharding.Mesh, base_dtype: str, *, abstract: bool
) -> tuple[Any, Any]:
    """A LoRA run's frozen base stored as ``base_dtype`` (:func:`models.quant.quantize_base`,
    once, on the mesh) and its sharding; float32: ``params`` as they are. ``params``: the
    float32 tree (``ShapeDtypeStruct``s when ``abstract``), ``axes`` its logical axes.

    Raises:
      ConfigError: a model nf4 cannot pack (an odd input dim of a projection).
    """
    if base_dtype == "float32":
        return params, logical_to_sharding(axes, mesh, RULES, shapes=params)
    fn = functools.partial(quant.quantize_base, base_dtype=base_dtype)
    try:
        shapes = jax.eval_shape(fn, params)
    except ValueError as e:  # nf4 packs two codes per byte: an odd input dim
        raise ConfigError(f"model.lora.base_dtype={base_dtype}: {e}") from None
    qaxes = quant.quantized_logical_axes(axes, base_dtype)
    sharding = logical_to_sharding(qaxes, mesh, RULES, shapes=shapes)
    if abstract:
        return _with_shardings(shapes, sharding), sharding
    return jax.jit(fn, out_shardings=sharding)(params), sharding


def _initial_state(
    optimizer: optax.GradientTransformation,
    trainable: Any,
    param_sharding: Any,
    mesh: jax.sharding.Mesh,
    rng: jax.Array,
    *,
    abstract: bool,
) -> tuple[TrainState, Any]:
    """The first :class:`TrainState` of ``trainable`` and its sharding: the optimizer state
    sharded like the parameters, step 0; ``abstract``: ``ShapeDtypeStruct``s, nothing
    allocated."""
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), trainable)
    state_sharding = state_sharding_from_params(optimizer, shapes, param_sharding, mesh)
    rep = replicated(mesh)
    if abstract:
        state = TrainState(
            params=trainable,
            opt_state=_with_shardings(
                jax.eval_shape(optimizer.init, shapes), state_sharding.opt_state
            ),
            step=jax.ShapeDtypeStruct((), jnp.int32, sharding=rep),
            rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep),
        )
    else:
        opt_state = jax.jit(optimizer.init, out_shardings=state_sharding.opt_state)(trainable)
        state = TrainState(
            params=trainable,
            opt_state=opt_state,
            step=jax.device_put(jnp.zeros((), jnp.int32), rep),
            rng=jax.device_put(jax.random.fold_in(rng, 2), rep),
        )
    return state, state_sharding


def _with_shardings(shapes: Any, shardings: Any, dtype: Any = None) -> Any:
    """``ShapeDtypeStruct``s of ``shapes`` carrying ``shardings`` (``dtype``: cast to it)."""
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype or s.dtype, sharding=sh),
        shapes,
        shardings,
    )


def router_aux_weight(cfg: RunConfig, config: models.ModelConfig, micro_batches: int) -> float:
    """:attr:`Policy.router_aux_weight`: α / M with α = ``model.router_aux_loss_coef`` (null:
    the model's) and M the micro-batches the run's train step sums (:attr:`RunPlan.rows`); 0
    for a dense model."""
    if not config.is_moe:
        return 0.0
    coef = cfg.model.router_aux_loss_coef
    coef = config.router_aux_loss_coef if coef is None else coef
    return float(coef) / max(int(micro_batches), 1)


def export_policy(policy: Policy, cfg: RunConfig) -> str | None:
    """Write the trained policy (LoRA adapters merged) as a Hugging Face directory (process
    0 writes; on a mesh spanning processes every process takes part in gathering the
    weights first)."""
    params = jax.device_get(to_host(policy.full_params()))
    if jax.process_index() != 0:
        return None
    from jaxrl_llm.interop import export_hf

    out = os.path.join(cfg.output_dir, "hf")
    tok = policy.tokenizer if hasattr(policy.tokenizer, "save_pretrained") else None
    export_hf(out, config=policy.config, params=params, tokenizer=tok)
    return out
