"""Compile a run's programs ahead of time for a TPU slice, without a TPU, and read their memory.

What ``jaxrl-llm compile`` runs. For one model, algorithm, mesh and batch it builds the same
programs the trainers build (:func:`jaxrl_llm.train.step.make_train_step` with the registry
loss and the run config's optimizer, the reference log-prob program, PPO's critic step, and
the sampler's decode loop :func:`jaxrl_llm.sampling.decode`), lowers them on a mesh of
abstract TPU devices (:mod:`jaxrl_llm.parallel.topology`) with every parameter, optimizer
moment and batch array an abstract ``ShapeDtypeStruct`` carrying its rule-table sharding, and
compiles them with the TPU compiler. Nothing the size of a weight is ever allocated.

Per program XLA reports, per device: argument, output, aliased (donated) and temporary
bytes. A program's own footprint is ``arguments + outputs − aliased + temporaries``. Arrays
that stay alive across the whole step but are not that program's arguments (the optimizer
state while sampling, the frozen reference while updating, PPO's critic) are added to it as
``resident``; the run's peak is the largest program footprint + resident. This is what
:func:`jaxrl_llm.train.memory.estimate_memory` estimates, and the report puts both side by
side.

Context parallelism (``context`` > 1): the programs are built as the trainers build them
under ``mesh.context`` (:func:`jaxrl_llm.train.policy.build_policy`): the policy's and the
critic's forwards are bound to the mesh (:func:`jaxrl_llm.parallel.under_mesh`), so their
self-attention goes round the ring over the ``context`` axis (Liu et al. 2023,
https://arxiv.org/abs/2310.01889); the train steps split every row's tokens over it
(:func:`jaxrl_llm.train.step.make_train_step`); the reference and the recompute forwards are
traced under the mesh too, their batch's tokens split over ``context`` as the step splits them
(the trainers run these two with the bound ``apply_fn`` only). T must be a multiple of the
context size, and the run config has ``logprobs.shared_prompt: false``
(:func:`jaxrl_llm.train.preflight.check_context`). The decode loop keeps each row's KV cache
whole (the samplers run unsharded along T). :func:`~jaxrl_llm.train.memory.estimate_memory`
has no notion of ring attention, so such a report has no estimate.

Not counted: host memory, the rollout batch while it sits on the host, buffers of one
program that the runtime frees before the next starts, and fragmentation of the allocator.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxrl_llm import models
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import (
    DEFAULT_RULES,
    batch_sharding,
    constrain_batch,
    logical_to_sharding,
    replicated,
    under_mesh,
)
from jaxrl_llm.parallel.topology import Topology, topology_mesh
from jaxrl_llm.train.aot_inputs import (  # noqa: F401
    _DTYPES,
    BATCHES,
    _abstract,
    _critic_batch,
    _decode_state_sharding,
    _per_device_bytes,
    _program,
    _run_config,
    _seq,
    analytic_train_flops,
    correction_entries,
)
from jaxrl_llm.train.aot_report import CompileReport, ProgramMemory  # noqa: F401
from jaxrl_llm.train.correction import CorrectionSection
from jaxrl_llm.train.memory import ALGORITHMS, estimate_memory
from jaxrl_llm.train.state import TrainState, state_sharding_from_params


def compile_run(
    config: models.ModelConfig,
    algorithm: str,
    topology: Topology,
    *,
    data: int = 1,
    fsdp: int = 1,
    tensor: int = 1,
    expert: int = 1,
    context: int = 1,
    batch_size: int = 8,
    seq_len: int = 1024,
    prompt_len: int | None = None,
    group_size: int = 8,
    minibatches: int = 1,
    micro_batches: int = 1,
    remat: str = "full",
    dtype: str = "bf16",
    lora_rank: int = 0,
    decode: bool = True,
    correction: CorrectionSection | None = None,
) -> CompileReport:
    """Compile a run's programs for ``topology`` and compare their memory with the estimate.

    Args:
      config: the policy's model config (critic / reward model: the same trunk, scalar head).
      algorithm: a name of :data:`jaxrl_llm.train.run_config.ONLINE_ALGORITHMS` or
        ``OFFLINE_ALGORITHMS`` (PPO: actor and critic steps).
      topology: from :func:`jaxrl_llm.parallel.topology.tpu_topology`.
      data, fsdp, tensor, expert: mesh axis sizes (product = the slice's devices; one may be
        -1). ``expert`` splits a mixture of experts' experts (its train step, reference and
        recompute forwards run expert-parallel, as the trainers run them; the decode loop
        runs the plain sorted dispatch, partitioned by GSPMD, as the sampler does).
      context: the ``context`` axis size C (context parallelism: every row's tokens split
        over C devices, attention as ring attention; module docstring). ``seq_len`` must be
        a multiple of C.
      batch_size: online: prompts per step (rows = prompts × group_size); offline: examples
        (pairs for preference losses) per step.
      seq_len: tokens per row, prompt + completion. prompt_len: online prompt part (default
        ``seq_len // 2``); the completion (generation) part is ``seq_len − prompt_len``.
      group_size: G samples per prompt (online).
      minibatches: online: optimizer updates per rollout batch (each sees rows / minibatches).
      micro_batches: offline: gradient-accumulation slices per step.
      remat: per-layer rematerialisation 'none' | 'dots' | 'full'.
      dtype: 'bf16' | 'fp32' compute dtype (master weights and optimizer state are float32).
      lora_rank: 0 = full fine-tuning; r > 0 trains rank-r adapters on a frozen base.
      decode: also compile the sampler's decode loop (online algorithms).
      correction: the run's ``rollout.correction`` (online algorithms whose loss takes it):
        the update's batch then carries ``is_weights`` (or ``proximal_logp`` when
        ``decoupled``), as :func:`jaxrl_llm.train.correction.correct_batch` builds it, and the
        learner's recompute forward over the rollout rows is compiled as ``recompute``.
    Returns:
      A :class:`CompileReport`.
    Raises:
      ConfigError: unknown algorithm, or sizes the mesh or the trainer reject.
    """
    from jaxrl_llm.losses import get_loss, sequence_logps
    from jaxrl_llm.sampling import SamplingConfig, init_decode_state
    from jaxrl_llm.sampling import decode as decode_loop
    from jaxrl_llm.train.policy import RULES, Policy, make_optimizer, router_aux_weight
    from jaxrl_llm.train.preflight import check_mesh
    from jaxrl_llm.train.run_config import (
        logprob_settings,
        loss_config,
        loss_spec,
        update_micro_batches,
    )
    from jaxrl_llm.train.step import make_train_step

    if algorithm not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {algorithm!r}; allowed: {sorted(ALGORITHMS)}")
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be 'bf16' or 'fp32', got {dtype!r}")
    mesh = topology_mesh(
        topology, data=data, fsdp=fsdp, tensor=tensor, expert=expert, context=context
    )
    sizes = {k: int(mesh.shape[k]) for k in ("data", "fsdp", "tensor", "expert", "context")}
    ctx = sizes["context"]
    prompt_len = seq_len // 2 if prompt_len is None else int(prompt_len)
    gen_len = seq_len - prompt_len
    if not 1 <= prompt_len < seq_len:
        raise ConfigError(f"prompt_len={prompt_len} must be in [1, seq_len={seq_len})")
    if seq_len % ctx:  # the trainers pad T up to a multiple of C; here T is what is asked for
        raise ConfigError(
            f"--seq-len {seq_len} cannot be split over the mesh's context axis ({ctx} "
            f"devices); use a multiple of {ctx}"
        )
    cfg = _run_config(
        algorithm,
        batch_size=batch_size,
        group_size=group_size,
        gen_len=gen_len,
        prompt_len=prompt_len,
        minibatches=minibatches,
        micro_batches=micro_batches,
        remat=remat,
        dtype=dtype,
        lora_rank=lora_rank,
        mesh=sizes,
        correction=correction,
    )
    check_mesh(cfg, mesh=mesh)
    config = dataclasses.replace(config, param_dtype="float32", compute_dtype=_DTYPES[dtype])
    spec = loss_spec(cfg)
    lc = loss_config(cfg)
    logprobs = logprob_settings(cfg)
    online = cfg.is_online
    optimizer = make_optimizer(cfg)
    apply_fn = functools.partial(models.apply, config=config, remat=remat)
    if config.is_moe:  # as build_policy binds it: the experts split over the expert axis
        apply_fn = functools.partial(apply_fn, mesh=mesh)
    if ctx > 1:  # as build_policy binds it: attention round the ring over the context axis
        apply_fn = under_mesh(apply_fn, mesh)
    shards = sizes["data"] * sizes["fsdp"]

    # Policy weights, abstract and sharded by the rule table (as build_policy shards them).
    full_shapes = jax.eval_shape(
        functools.partial(models.init_params, config), jax.random.PRNGKey(0)
    )
    full_sharding = logical_to_sharding(
        models.param_logical_axes(config), mesh, RULES, shapes=full_shapes
    )
    full = _abstract(full_shapes, full_sharding)
    lora = None
    frozen, frozen_sharding = {}, {}
    if lora_rank:
        from jaxrl_llm.models.lora import LoRAConfig, init_lora, lora_logical_axes

        lora = LoRAConfig(
            rank=cfg.model.lora.rank, alpha=cfg.model.lora.alpha, targets=cfg.model.lora.targets
        )
        t_shapes = jax.eval_shape(lambda r: init_lora(config, lora, r), jax.random.PRNGKey(0))
        t_sharding = logical_to_sharding(lora_logical_axes(lora), mesh, RULES, shapes=t_shapes)
        frozen, frozen_sharding = {"base": full}, {"base": full_sharding}
    else:
        t_shapes, t_sharding = full_shapes, full_sharding
    state_sharding = state_sharding_from_params(optimizer, t_shapes, t_sharding, mesh)
    rep = replicated(mesh)
    state = TrainState(
        params=_abstract(t_shapes, t_sharding),
        opt_state=_abstract(jax.eval_shape(optimizer.init, t_shapes), state_sharding.opt_state),
        step=jax.ShapeDtypeStruct((), jnp.int32, sharding=rep),
        rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep),
    )
    policy = Policy(
        config=config,
        tokenizer=None,
        mesh=mesh,
        base=frozen.get("base"),
        lora=lora,
        state=state,
        state_sharding=state_sharding,
        apply_fn=apply_fn,
        optimizer=optimizer,
        param_sharding=t_sharding,
        frozen_sharding=frozen_sharding,
        router_aux_weight=router_aux_weight(cfg, config, mesh),
    )

    # What lives through the whole step (bytes per device), as the trainers hold it.
    resident: dict[str, int] = {"policy train state": _per_device_bytes(state)}
    if lora is not None:
        resident["frozen base (= reference)"] = _per_device_bytes(full)
    # the loss reads reference log-probs; PPO's strategy needs them for its KL-shaped reward
    ref_in_loss = spec.reference_fn is not None and spec.uses_reference(lc)
    needs_ref = spec.reference_fn is not None and (ref_in_loss or cfg.algo.critic)
    ref_params = frozen.get("base", full)
    if needs_ref and lora is None:
        # Policy.reference_params: a jnp.copy of the float32 master params
        resident["reference weights (copy of master)"] = _per_device_bytes(full)

    # rows: the rollout batch (online) and one update's share of it
    from jaxrl_llm.losses import Family

    if cfg.algo.family is Family.ONLINE_PAIRS:  # one pair per prompt from its G samples
        rollout_rows, step_rows = batch_size * group_size, batch_size
    elif online:
        rollout_rows = batch_size * group_size
        step_rows = rollout_rows // minibatches
    else:
        rollout_rows = step_rows = batch_size
    step_micro = update_micro_batches(cfg, lc, shards=shards) if online else cfg.train.micro_batches
    zero_fn = spec.zero_batch_fn(lc) if (online and step_micro > 1 and spec.zero_batch_fn) else None
    rows_sharding = batch_sharding(mesh)

    critic_state = critic_step = None
    if cfg.algo.critic:
        cconfig = dataclasses.replace(config, num_labels=1)
        c_shapes = jax.eval_shape(
            functools.partial(models.init_params, cconfig), jax.random.PRNGKey(0)
        )
        c_sharding = logical_to_sharding(
            models.param_logical_axes(cconfig), mesh, RULES, shapes=c_shapes
        )
        c_opt = make_optimizer(cfg)
        c_state_sharding = state_sharding_from_params(c_opt, c_shapes, c_sharding, mesh)
        critic_state = TrainState(
            params=_abstract(c_shapes, c_sharding),
            opt_state=_abstract(jax.eval_shape(c_opt.init, c_shapes), c_state_sharding.opt_state),
            step=state.step,
            rng=state.rng,
        )
        resident["critic train state"] = _per_device_bytes(critic_state)
        # the reward model: a scalar-head model of the policy's size, float32 as loaded
        resident["reward model weights"] = _per_device_bytes(_abstract(c_shapes, c_sharding))
        cspec = get_loss("ppo_critic")
        clc = cspec.preset(value_clip=cfg.ppo.value_clip)
        c_apply = functools.partial(models.apply, config=cconfig, remat=remat)
        if ctx > 1:
            c_apply = under_mesh(c_apply, mesh)
        critic_step = make_train_step(
            lambda p, b, **kw: cspec.loss_fn(p, b, apply_fn=c_apply, config=clc, **kw),
            c_opt,
            mesh=mesh,
            state_sharding=c_state_sharding,
            batch_sharding=rows_sharding,
            micro_batches=1,
            denominator_fn=functools.partial(cspec.denominator_fn, config=clc),
            grad_clip=cfg.optim.grad_clip,
        )

    def others(*used: str, minus: int = 0) -> int:
        return sum(v for k, v in resident.items() if k not in used) - minus

    def forward_under_mesh(fn):
        """A forward program (``fn(params, batch, ...)``) as the train step runs its loss on
        a context mesh: traced under the mesh, the batch's tokens split over ``context``."""
        if ctx == 1:
            return fn

        def split(params, batch, *rest):
            return fn(params, constrain_batch(batch, mesh), *rest)

        return under_mesh(split, mesh)

    programs = []
    # 1. the policy update (the trainers' make_train_step, as online.py / offline.py call it)
    step = make_train_step(
        policy.loss_fn(spec.loss_fn, loss_config=lc, logprobs=logprobs),
        optimizer,
        mesh=mesh,
        state_sharding=state_sharding,
        batch_sharding=rows_sharding,
        micro_batches=step_micro,
        denominator_fn=functools.partial(spec.denominator_fn, config=lc),
        grad_clip=cfg.optim.grad_clip,
        frozen_sharding=frozen_sharding,
        skip_fn=zero_fn,
    )
    t = prompt_len + gen_len
    batch = BATCHES[spec.batch_kind](step_rows, t, with_ref=ref_in_loss)
    if correction is not None:  # the corrected batch the learner hands the step
        batch.update(correction_entries(step_rows, t, decoupled=correction.decoupled))
    programs.append(
        _program(
            "train",
            step.jitted,  # type: ignore[attr-defined]
            (state, batch, frozen, {}),
            others("policy train state", "frozen base (= reference)"),
        )
    )
    # 2. the reference log-probs over the rollout batch (or the offline batch)
    if needs_ref:
        assert spec.reference_fn is not None
        ref_fn = functools.partial(
            spec.reference_fn, apply_fn=apply_fn, config=lc, logprobs=logprobs
        )
        ref_jit = jax.jit(forward_under_mesh(ref_fn), in_shardings=(full_sharding, rows_sharding))
        ref_batch = BATCHES[spec.batch_kind](
            step_rows if cfg.algo.family is Family.ONLINE_PAIRS else rollout_rows, t, with_ref=False
        )
        programs.append(
            _program(
                "reference",
                ref_jit,
                (ref_params, ref_batch),
                others("frozen base (= reference)", "reference weights (copy of master)"),
            )
        )
    # 3. PPO's critic update
    if critic_step is not None:
        programs.append(
            _program(
                "critic",
                critic_step.jitted,  # type: ignore[attr-defined]
                (critic_state, _critic_batch(step_rows, t), {}, {}),
                others("critic train state"),
            )
        )
    if correction is not None:  # 4. rollout.correction's recompute forward (every row at most)
        logps = policy.logps_fn(functools.partial(sequence_logps, **logprobs.kwargs()))
        shardings = (t_sharding, rows_sharding, frozen_sharding)
        fn = jax.jit(forward_under_mesh(lambda p, b, f: logps(p, b, **f)), in_shardings=shardings)
        args = (state.params, _seq(rollout_rows, t), frozen)
        rest = others("frozen base (= reference)", minus=_per_device_bytes(state.params))
        programs.append(_program("recompute", fn, args, rest))
    # 5. the sampler's decode loop over the rollout rows (prefilled prompts, G per prompt)
    if online and decode:
        n_prompts = batch_size
        cache_len = prompt_len + gen_len

        def init(last_logits, cache, pos, ids):
            return init_decode_state(
                last_logits,
                cache,
                pos,
                ids,
                seed=0,
                num_samples=group_size,
                gen_len=gen_len,
                max_new_tokens=gen_len,
            )

        dstate = jax.eval_shape(
            init,
            jax.ShapeDtypeStruct((n_prompts, config.vocab_size), jnp.float32),
            jax.eval_shape(lambda: models.init_cache(config, n_prompts, cache_len)),
            jax.ShapeDtypeStruct((n_prompts,), jnp.int32),
            jax.ShapeDtypeStruct((n_prompts,), jnp.int32),
        )
        # the cache's slots whole on every device of the context axis (module docstring)
        dsharding = _decode_state_sharding(dstate, mesh, {**DEFAULT_RULES, "length": None})
        sampling = SamplingConfig()
        dec = jax.jit(
            lambda p, s: decode_loop(
                p, s, config=config, sampling=sampling, stop_ids=(0,), pad_id=0
            ),
            in_shardings=(full_sharding, dsharding),
            out_shardings=dsharding,
            donate_argnums=(1,),
        )
        if lora is None:  # full fine-tuning samples with the master params themselves
            resident_dec = others(minus=_per_device_bytes(full))
        else:  # LoRA samples with a merged copy (an argument), the base stays resident
            resident_dec = others()
        programs.append(_program("decode", dec, (full, _abstract(dstate, dsharding)), resident_dec))

    rows_per_update = step_rows // step_micro
    # the estimator, asked about the same run (these settings are kept in the report)
    est_kwargs = dict(
        batch_size=batch_size,
        seq_len=t,
        prompt_len=prompt_len,
        group_size=group_size,
        dtype=dtype,
        lora_rank=lora_rank,
        remat=remat,
        device=f"tpu-{topology.generation}",
        micro_batches=max(1, (rollout_rows if online else step_rows) // max(rows_per_update, 1)),
        prompt_group_size=int(logprobs.prompt_group_size),
        **{k: v for k, v in sizes.items() if k != "context"},
    )
    # the estimator knows no ring attention: with context > 1 the report has no estimate
    est = (
        estimate_memory(config, algorithm, **est_kwargs)  # type: ignore[arg-type]
        if ctx == 1
        else None
    )
    settings = dict(
        batch_size=batch_size,
        seq_len=t,
        prompt_len=prompt_len,
        train_flops_analytic=analytic_train_flops(config, step_rows * t, remat=remat)
        / topology.num_devices,
        group_size=group_size if online else None,
        minibatches=minibatches,
        micro_batches=step_micro,
        remat=remat,
        dtype=dtype,
        lora_rank=lora_rank,
        rows_per_update=rows_per_update,
        params=config.num_params(),
        active_params=config.num_params(active=True),
        estimate_kwargs=est_kwargs,
    )
    return CompileReport(
        topology=topology.name,
        algorithm=algorithm,
        # context listed when the run splits tokens (reports without it keep their four axes)
        mesh={k: v for k, v in sizes.items() if k != "context" or v > 1},
        hbm_bytes=topology.hbm_bytes_per_device,
        programs=tuple(programs),
        resident=resident,
        estimate=est,
        settings=settings,
    )
