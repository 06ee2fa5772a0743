"""Compile a run's programs ahead of time for a TPU slice, without a TPU, and read their memory.

What ``jaxrl-llm compile`` runs. :func:`compile_run` takes a run config (a ``jaxrl-llm train``
YAML, or one :func:`~jaxrl_llm.train.compile.aot_inputs.run_config_for` builds from the command's
sizes), resolves it with :func:`~jaxrl_llm.train.config.plan.plan_run` for a mesh of abstract TPU
devices (:mod:`jaxrl_llm.parallel.topology`), builds an abstract policy
(:func:`~jaxrl_llm.train.programs.policy.policy_on_mesh` without weights: every parameter and optimizer
moment a ``ShapeDtypeStruct`` carrying its rule-table sharding) and gets the run's programs
from the trainers' own builder (:func:`~jaxrl_llm.train.programs.builder.build_programs`: the train
step, the reference and recompute forwards, PPO's critic step), then lowers them on the plan's
batch layout (packed with ``logprobs.pack``, with the correction's entry, traced
hyperparameters when scheduled) and compiles them with the TPU compiler, with the sampler's
decode loop :func:`jaxrl_llm.sampling.decode`. Nothing the size of a weight is ever
allocated.

Per program XLA reports, per device: argument, output, aliased (donated) and temporary
bytes. A program's own footprint is ``arguments + outputs − aliased + temporaries``. Arrays
that stay alive across the whole step but are not that program's arguments (the optimizer
state while sampling, the frozen reference while updating, PPO's critic) are added to it as
``resident``; the run's peak is the largest program footprint + resident. This is what
:func:`jaxrl_llm.train.compile.memory.estimate_memory` estimates, and the report puts both side by
side.

Context parallelism (``context`` > 1): the programs are built as the trainers build them
under ``mesh.context`` (:func:`jaxrl_llm.train.programs.policy.build_policy`): the policy's and the
critic's forwards are bound to the mesh (:func:`jaxrl_llm.parallel.under_mesh`), so their
self-attention goes round the ring over the ``context`` axis (Liu et al. 2023,
https://arxiv.org/abs/2310.01889); the train steps split every row's tokens over it
(:func:`jaxrl_llm.train.programs.step.make_train_step`); the reference and the recompute forwards are
traced under the mesh too, their batch's tokens split over ``context`` as the step splits them
(:func:`jaxrl_llm.train.programs.builder.forward_under_mesh`). T must be a multiple of the
context size, and the run config has ``logprobs.shared_prompt: false``
(:func:`jaxrl_llm.train.config.preflight.check_context`). The decode loop keeps each row's KV cache
whole (the samplers run unsharded along T). :func:`~jaxrl_llm.train.compile.memory.estimate_memory`
has no notion of ring attention, so such a report has no estimate.

Not counted: host memory, the rollout batch while it sits on the host, buffers of one
program that the runtime frees before the next starts, and fragmentation of the allocator.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm import models
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel import batch_sharding
from jaxrl_llm.parallel.decode_model import tpu_chip
from jaxrl_llm.parallel.sampler_copy import SamplerCopy
from jaxrl_llm.parallel.topology import Topology, topology_mesh
from jaxrl_llm.train.compile.aot_decode import SAMPLER_COPY, compile_sampler
from jaxrl_llm.train.compile.aot_inputs import (
    DTYPES,
    analytic_train_flops,
    compile_program,
    per_device_bytes,
    run_config_for,
)
from jaxrl_llm.train.compile.aot_report import CompileReport, ProgramMemory
from jaxrl_llm.train.compile.memory import estimate_memory
from jaxrl_llm.train.compile.step_model import HOP_LATENCY_S
from jaxrl_llm.train.config.batch_layout import CRITIC_LAYOUT, SEQUENCE_LAYOUT
from jaxrl_llm.train.config.plan import RunPlan, plan_for_model, plan_run
from jaxrl_llm.train.config.preflight import check_mesh
from jaxrl_llm.train.config.run_config import RunConfig
from jaxrl_llm.train.programs.builder import (
    build_critic,
    build_programs,
    build_teacher_programs,
    critic_policy,
)
from jaxrl_llm.train.programs.policy import Policy, policy_on_mesh
from jaxrl_llm.train.programs.teacher import Teacher, teacher_on_mesh

__all__ = ["CompileReport", "ProgramMemory", "compile_preset", "compile_run"]


def compile_preset(
    config: models.ModelConfig, algorithm: str, topology: Topology, **sizes: Any
) -> CompileReport:
    """:func:`compile_run` of the run :func:`~jaxrl_llm.train.compile.aot_inputs.run_config_for`
    builds from ``algorithm`` and ``sizes`` (``jaxrl-llm compile --model ... --algorithm ...``).

    ``sizes``: ``run_config_for``'s keywords, ``decode`` and ``sampler_only``."""
    decode = bool(sizes.pop("decode", True))
    sampler_only = bool(sizes.pop("sampler_only", False))
    cfg, seq_len, prompt_len = run_config_for(algorithm, **sizes)
    kw = dict(seq_len=seq_len, prompt_len=prompt_len, decode=decode, sampler_only=sampler_only)
    return compile_run(cfg, config, topology, **kw)  # type: ignore[arg-type]


def compile_run(
    cfg: RunConfig,
    config: models.ModelConfig,
    topology: Topology,
    *,
    seq_len: int | None = None,
    prompt_len: int | None = None,
    decode: bool = True,
    sampler_only: bool = False,
) -> CompileReport:
    """Compile the programs ``jaxrl-llm train cfg`` runs for ``topology`` and compare their
    memory with the estimate (module docstring).

    Args:
      cfg: the run config (its mesh sizes are the topology's axes; one may be -1).
      config: the policy's model config (float32 master weights; the compute dtype is
        ``cfg.model.compute_dtype``).
      topology: from :func:`jaxrl_llm.parallel.topology.tpu_topology`.
      seq_len: tokens per learner row (default: online ``data.max_length`` prompt tokens +
        ``rollout.max_new_tokens``; offline ``data.max_length``). A multiple of
        ``mesh.context``.
      prompt_len: online, the prompt part of ``seq_len`` (default ``data.max_length``).
      decode: also compile the sampler's decode loop (online).
      sampler_only: compile only the sampler's programs (reshard, decode loop; online).

    Returns:
      A :class:`CompileReport`.

    Raises:
      ConfigError: sizes the mesh or the trainer reject.
    """
    m = cfg.mesh
    mesh = topology_mesh(
        topology, data=m.data, fsdp=m.fsdp, tensor=m.tensor, expert=m.expert, context=m.context
    )
    plan = plan_run(cfg, check_mesh(cfg, mesh=mesh), processes=_processes(topology), platform="tpu")
    sizes = dict(plan.mesh)
    seq_len, prompt_len = _lengths(plan, seq_len, prompt_len)
    config = config.replace(
        param_dtype="float32",
        compute_dtype=cfg.model.compute_dtype,
        attention=models.AttentionImpl(cfg.model.attention),
    )
    rows = plan.rows
    policy = policy_on_mesh(
        cfg,
        config,
        mesh,
        micro_batches=rows.micro_batches,
        updates_per_step=rows.epochs * rows.minibatches,
    )
    teacher = None
    if plan.needs.teacher:
        assert cfg.teacher is not None
        # no weights are read: the teacher's architecture is taken to be the policy's
        teacher = teacher_on_mesh(config, mesh, dtype=cfg.teacher.dtype)
    resident = _resident(plan, policy, teacher)
    copy = None
    if plan.online:
        plan, copy = _sampler(plan, policy, topology, resident, seq_len, prompt_len)
    if sampler_only and copy is not None:
        rest = lambda *used: sum(v for k, v in resident.items() if k not in used)
        programs = compile_sampler(plan, policy, copy, rest, seq_len, prompt_len)
    else:
        programs = _compile_programs(
            plan, policy, resident, seq_len, prompt_len, decode, teacher, copy
        )
    programs = _with_model_flops(programs, plan, config, seq_len, prompt_len)
    est = None
    if sizes["context"] == 1:  # the estimator knows no ring attention
        est = estimate_memory(
            config, cfg.algorithm, **_estimate_kwargs(plan, topology, seq_len, prompt_len)
        )  # type: ignore[arg-type]
    settings = _report_settings(cfg, plan, config, topology, seq_len, prompt_len)
    return CompileReport(
        topology=topology.name,
        algorithm=cfg.algorithm,
        # context listed when the run splits tokens (reports without it keep their four axes)
        mesh={k: v for k, v in sizes.items() if k != "context" or v > 1},
        hbm_bytes=topology.hbm_bytes_per_device,
        programs=tuple(programs),
        resident=resident,
        estimate=est,
        settings=settings,
        chip=dict(
            peak_flops=topology.peak_flops_per_device,
            hbm_bandwidth=topology.hbm_bandwidth_per_device,
            ici_bandwidth=topology.ici_bandwidth_per_device,
            hop_latency=HOP_LATENCY_S.get(topology.generation),
        ),
    )


def _report_settings(
    cfg: RunConfig,
    plan: RunPlan,
    config: models.ModelConfig,
    topology: Topology,
    seq_len: int,
    prompt_len: int,
) -> dict[str, Any]:
    """The run's settings a :class:`CompileReport` records beside the compiled programs."""
    rows = plan.rows
    return dict(
        batch_size=cfg.rollout.prompts_per_step if plan.online else cfg.train.batch_size,
        seq_len=seq_len,
        prompt_len=prompt_len,
        train_flops_analytic=analytic_train_flops(
            config, rows.per_update * seq_len, remat=cfg.model.remat
        )
        / topology.num_devices,
        group_size=rows.group if plan.online else None,
        minibatches=rows.minibatches,
        micro_batches=rows.micro_batches,
        remat=cfg.model.remat,
        dtype=_dtype_name(cfg.model.compute_dtype),
        lora_rank=cfg.model.lora.rank if cfg.model.lora else 0,
        rows_per_update=rows.per_update // rows.micro_batches,
        params=config.num_params(),
        active_params=config.num_params(active=True),
        estimate_kwargs=_estimate_kwargs(plan, topology, seq_len, prompt_len),
        devices=topology.num_devices,
        sampler=(
            f"{plan.placement.sampler.describe()} ({plan.placement.why})" if plan.online else None
        ),
    )


def _processes(topology: Topology) -> int:
    """How many hosts (processes of a job) the slice's devices belong to."""
    return len({getattr(d, "process_index", 0) for d in topology.devices})


def _with_model_flops(
    programs: list[ProgramMemory],
    plan: RunPlan,
    config: models.ModelConfig,
    seq_len: int,
    prompt_len: int,
) -> list[ProgramMemory]:
    """Each program with its model FLOPs per device and call and its calls per step: the
    train and critic steps 6·N per token over an update's rows, ``epochs × minibatches``
    times a step; the reference and recompute forwards 2·N per token over their rows; the
    decode loop 2·N per generated token, ``prompts × G × (seq_len − prompt_len)`` tokens
    (N: the active parameters less an untied input embedding table, a lookup that does no
    matmul, as Kaplan et al. 2020, https://arxiv.org/abs/2001.08361, leave embeddings out;
    no recomputation, no attention T² term, the critic counted at the policy's size). Where
    the policy's forwards share each group's prompt (``logprobs.shared_prompt``: G rows, one
    prompt) a row's prompt tokens count once per group, as the programs compute them."""
    rows, n = plan.rows, config.num_params(active=True)
    if not config.tie_embeddings:  # the unembedding is a matmul, the embedding a lookup
        n -= config.vocab_size * config.hidden_size
    devices = math.prod(plan.mesh.values())
    updates = rows.epochs * rows.minibatches
    gen_len = seq_len - prompt_len
    gen_rows = plan.cfg.rollout.prompts_per_step * rows.group
    g = plan.logprobs.prompt_group_size if plan.online else 1

    def tokens(r: int) -> float:  # the tokens a policy forward over r rows computes
        return r * (seq_len - prompt_len) + r / g * prompt_len if g > 1 else r * seq_len

    per_call = {
        "train": (6.0 * n * tokens(rows.per_update), updates),
        "critic": (6.0 * n * rows.per_update * seq_len, updates),
        "reference": (2.0 * n * tokens(rows.forward), 1),
        "recompute": (2.0 * n * tokens(rows.forward), 1),
        "teacher": (2.0 * n * rows.forward * seq_len, 1),  # the policy's architecture
        "decode": (2.0 * n * gen_rows * gen_len, 1),
        "reshard": (0.0, 1),  # moves weights, computes nothing of the model
    }
    out = []
    for p in programs:
        flops, calls = per_call.get(p.name, (None, 1))
        out.append(
            dataclasses.replace(
                p, model_flops=None if flops is None else flops / devices, calls_per_step=calls
            )
        )
    return out


def _lengths(plan: RunPlan, seq_len: int | None, prompt_len: int | None) -> tuple[int, int]:
    """(tokens per learner row, prompt tokens) of the compiled batch (:func:`compile_run`)."""
    cfg = plan.cfg
    gen = cfg.rollout.max_new_tokens if plan.online else 0
    if seq_len is None:
        if cfg.data.max_length is None:
            raise ConfigError(
                "data.max_length is not set: give the compiled row length (--seq-len)"
            )
        seq_len = cfg.data.max_length + gen
    prompt_len = seq_len - gen if prompt_len is None else int(prompt_len)
    if plan.online and not 1 <= prompt_len < seq_len:
        raise ConfigError(f"prompt_len={prompt_len} must be in [1, seq_len={seq_len})")
    c = plan.mesh["context"]
    if seq_len % c:  # the trainers pad T up to a multiple of C; here T is what is asked for
        raise ConfigError(
            f"--seq-len {seq_len} cannot be split over the mesh's context axis ({c} "
            f"devices); use a multiple of {c}"
        )
    return seq_len, prompt_len


def _resident(plan: RunPlan, policy: Policy, teacher: Teacher | None = None) -> dict[str, int]:
    """Bytes per device that live through the whole step, as the trainers hold them."""
    resident: dict[str, int] = {"policy train state": per_device_bytes(policy.state)}
    if teacher is not None:
        resident["teacher weights"] = per_device_bytes(teacher.params)
    if policy.lora is not None:
        resident["frozen base (= reference)"] = per_device_bytes(policy.base)
    elif plan.needs.reference:  # Policy.reference_params: a copy of the float32 master params
        resident["reference weights (copy of master)"] = per_device_bytes(policy.state.params)
    if plan.needs.critic:
        critic = critic_policy(plan, policy, abstract=True)
        resident["critic train state"] = per_device_bytes(critic.state)
        # the reward model: a scalar-head model of the policy's size, float32 as loaded
        resident["reward model weights"] = per_device_bytes(critic.state.params)
    return resident


def _abstract_step_batch(plan: RunPlan, policy: Policy, rows_sharding, seq_len: int) -> Any:
    """The train step's batch of one update as abstract arrays, in the plan's step layout."""
    pack = plan.pack
    packed_len = seq_len
    if pack is not None and pack.row_len is not None:
        packed_len = -(-pack.row_len // plan.mesh["context"]) * plan.mesh["context"]
    return plan.step_layout.abstract(
        rows_sharding,
        rows=plan.rows.per_update,
        tokens=seq_len,
        window=plan.cfg.rollout.max_new_tokens,
        packed_rows=plan.rows.per_update,  # at most one packed row per episode
        packed_len=packed_len,
        layers=policy.config.num_layers,  # a recorded MoE routing's (rollout.routing_replay)
        topk=policy.config.num_experts_per_tok,
        teacher_tokens=seq_len,  # the teacher's prompt taken as long as the student's
    )


def _compile_programs(
    plan: RunPlan,
    policy: Policy,
    resident: dict[str, int],
    seq_len: int,
    prompt_len: int,
    decode: bool,
    teacher: Teacher | None = None,
    copy: SamplerCopy | None = None,
) -> list[ProgramMemory]:
    """The run's programs (:func:`~jaxrl_llm.train.programs.builder.build_programs`) compiled on the
    plan's abstract batches, each with the resident bytes of what is not its argument; with a
    teacher, its forward (reverse KL) or its weights as the step's argument (GKD)."""

    def others(*used: str, minus: int = 0) -> int:
        return sum(v for k, v in resident.items() if k not in used) - minus

    rows, mesh = plan.rows, policy.mesh
    rows_sharding = batch_sharding(mesh)
    programs = build_programs(plan, policy, teacher=teacher)
    frozen = policy.frozen()
    step_frozen = dict(frozen)
    if plan.needs.teacher_in_loss:
        assert teacher is not None
        step_frozen["teacher"] = teacher.params
    batch = _abstract_step_batch(plan, policy, rows_sharding, seq_len)
    hparams = {k: jax.ShapeDtypeStruct((), jnp.float32) for k in plan.needs.traced_hparams}
    out = [
        compile_program(
            "train",
            programs.train.jitted,  # type: ignore[attr-defined]
            (policy.state, batch, step_frozen, hparams),
            others(
                "policy train state",
                "frozen base (= reference)",
                *(("teacher weights",) if plan.needs.teacher_in_loss else ()),
            ),
            num_devices=mesh.size,
        )
    ]
    if teacher is not None and not plan.needs.teacher_in_loss:  # reverse-KL advantages
        seq = SEQUENCE_LAYOUT.abstract(rows_sharding, rows=rows.forward, tokens=seq_len)
        t_fn = build_teacher_programs(plan, policy, teacher).teacher
        out.append(
            compile_program(
                "teacher",
                t_fn,
                (teacher.params, seq),
                others("teacher weights"),
                num_devices=mesh.size,
            )
        )
    if programs.reference is not None:
        ref_params = policy.base if policy.lora is not None else policy.state.params
        ref_batch = plan.input_layout.abstract(rows_sharding, rows=rows.forward, tokens=seq_len)
        out.append(
            compile_program(
                "reference",
                programs.reference,
                (ref_params, ref_batch),
                others("frozen base (= reference)", "reference weights (copy of master)"),
                num_devices=mesh.size,
            )
        )
    if plan.needs.critic:
        critic = critic_policy(plan, policy, abstract=True)
        critic_train = build_critic(plan, critic).train
        cbatch = CRITIC_LAYOUT.abstract(rows_sharding, rows=rows.per_update, tokens=seq_len)
        out.append(
            compile_program(
                "critic",
                critic_train.jitted,  # type: ignore[attr-defined]
                (critic.state, cbatch, {}, {}),
                others("critic train state"),
                num_devices=mesh.size,
            )
        )
    if programs.recompute is not None:  # rollout.correction's recompute (every row at most)
        rest = others("frozen base (= reference)", minus=per_device_bytes(policy.state.params))
        seq = SEQUENCE_LAYOUT.abstract(rows_sharding, rows=rows.forward, tokens=seq_len)
        lowered_args = (policy.state.params, seq)
        out.append(
            compile_program(
                "recompute",
                programs.recompute,
                lowered_args,
                rest,
                kwargs=frozen,
                num_devices=mesh.size,
            )
        )
    if plan.online and decode:
        assert copy is not None
        out += compile_sampler(plan, policy, copy, others, seq_len, prompt_len)
    return out


def _sampler(
    plan: RunPlan,
    policy: Policy,
    topology: Topology,
    resident: dict[str, int],
    seq_len: int | None,
    prompt_len: int | None,
):
    """``(plan, copy)``: the plan with the sampler's layout chosen for this model on this
    chip (``rollout.tensor: auto``), and its :class:`~jaxrl_llm.parallel.sampler_copy.SamplerCopy`
    over the slice's devices."""
    # the copy stays beside everything else of the step, as jaxrl-llm memory counts it
    without = 0.0
    if plan.mesh["context"] == 1:
        kw = _estimate_kwargs(plan, topology, *_lengths(plan, seq_len, prompt_len))
        without = estimate_memory(policy.config, plan.cfg.algorithm, **kw).total_bytes_per_device
    else:
        without = float(sum(resident.values()))
    plan = plan_for_model(plan, policy.config, chip=tpu_chip(topology), resident_bytes=without)
    copy = SamplerCopy(
        plan.placement.sampler,
        models.param_logical_axes(policy.config),
        devices=topology.devices,
    )
    full = policy.full_shapes()
    # kept from step to step: each new copy is written into the previous one's buffers (none
    # when the sampler reads the learner's own arrays)
    if not plan.placement.sampler_reads_learner:
        resident[SAMPLER_COPY] = per_device_bytes(copy.abstract(full, local=True))
    return plan, copy


def _dtype_name(compute_dtype: str) -> str:
    return {v: k for k, v in DTYPES.items()}.get(compute_dtype, compute_dtype)


def _estimate_kwargs(plan: RunPlan, topology: Topology, seq_len: int, prompt_len: int) -> dict:
    """What :func:`~jaxrl_llm.train.compile.memory.estimate_memory` is asked about the same run."""
    cfg, rows = plan.cfg, plan.rows
    return dict(
        batch_size=cfg.rollout.prompts_per_step if plan.online else cfg.train.batch_size,
        seq_len=seq_len,
        prompt_len=prompt_len,
        group_size=cfg.rollout.group_size,
        dtype=_dtype_name(cfg.model.compute_dtype),
        lora_rank=cfg.model.lora.rank if cfg.model.lora else 0,
        lora_base_dtype=cfg.model.lora.base_dtype if cfg.model.lora else None,
        remat=cfg.model.remat,
        device=f"tpu-{topology.generation}",
        micro_batches=rows.micro_batches,
        minibatches=max(1, rows.per_step // max(rows.per_update, 1)),
        prompt_group_size=int(plan.logprobs.prompt_group_size),
        **_sampler_kwargs(plan),
        **{k: v for k, v in plan.mesh.items() if k != "context"},
    )


def _sampler_kwargs(plan: RunPlan) -> dict:
    """The sampler's copy as :func:`estimate_memory` takes it (online; its layout chosen)."""
    if not plan.online or plan.placement.tensor_auto or plan.placement.sampler_reads_learner:
        return {}
    s = plan.placement.sampler
    processes = max(s.count // int(math.prod(s.sizes.values())), 1)
    return dict(
        sampler_tensor=s.tensor,
        sampler_replicas=s.replicas * processes,
        sampler_dtype=_dtype_name(s.dtype) if s.dtype else None,
    )
