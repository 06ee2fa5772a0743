"""The run plan: a ``jaxrl-llm train`` config resolved once, before a model loads.

:func:`plan_run` turns a validated :class:`~jaxrl_llm.train.config.run_config.RunConfig` and the
mesh's axis sizes into a frozen :class:`RunPlan`. Everything the trainers and ``jaxrl-llm
compile`` ask of a config after validation is a field of it, read, never recomputed:

* the loss: its registry spec, its validated config (paper preset + ``loss:`` + a budget
  ``max_len``), the log-prob settings of its forwards;
* the rows: per step, per optimizer update, minibatches, micro-batches (the skippable layout
  of ``rollout.skip_zero_advantage``), groups;
* packing and staleness;
* the placement: where each role lives (learner, sampler, reference, teacher, critic), its
  devices, mesh and dtype (:class:`~jaxrl_llm.parallel.placement.Placement`): the one place a
  run's layout is decided;
* what the update needs: a reference forward, a critic, a correction entry, traced
  hyperparameters;
* the learner batch as data (:class:`~jaxrl_llm.train.config.batch_layout.BatchLayout`, whose
  fields are :mod:`~jaxrl_llm.train.config.batch_layout`'s): the keys, dimensions and dtypes
  the policy's train step takes, and the entries a companion update (PPO's critic) reads
  beside them. Strategies hand the learner batches that ``BatchLayout.check`` accepts, and
  the compiler lowers the step on ``BatchLayout.abstract`` of the same layout.

The loss's config, log-prob settings and micro-batches are resolved by
:mod:`~jaxrl_llm.train.config.loss_plan`.

Per-family answers come from the algorithm's registry entry
(:class:`jaxrl_llm.losses.Algorithm`: ``rl_batches``, ``pairs_per_group``,
``group_skipping``); nothing here compares families or names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.losses import LogprobSettings
from jaxrl_llm.losses.registry import Algorithm, LossSpec
from jaxrl_llm.parallel.decode_model import Chip
from jaxrl_llm.parallel.placement import Placement, plan_placement, resolve_sampler
from jaxrl_llm.train.config.batch_layout import (
    CRITIC_FIELDS,
    KIND_FIELDS,
    PAIR_ROUTING_FIELDS,
    REFERENCE_FIELDS,
    ROUTING_FIELD,
    BatchField,
    BatchLayout,
    float_fields,
    packed_layout,
)
from jaxrl_llm.train.config.loss_plan import logprob_settings, loss_config, update_micro_batches
from jaxrl_llm.train.config.run_config import RunConfig

MESH_SIZES = ("data", "fsdp", "tensor", "expert", "context")


# ----- the plan --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PackSpec:
    """How the learner packs its rows (``logprobs.pack``).

    Attributes:
      window: the completion columns W every target sits in (``rollout.max_new_tokens``).
      row_len: the packed rows' length (None: the batch's padded T).
    """

    window: int
    row_len: int | None = None


@dataclasses.dataclass(frozen=True)
class Rows:
    """How a step's rows split into updates.

    Attributes:
      per_step: rows a step trains on: online the rollout's prompts × G, offline the batch.
      per_update: rows one optimizer update sees (online pairs: one pair per prompt).
      minibatches: optimizer updates per epoch over the step's rows.
      epochs: passes over the step's rows (offline 1).
      micro_batches: slices one update accumulates over (online: the skippable layout of
        ``rollout.skip_zero_advantage``, :func:`update_micro_batches`).
      forward: rows one reference (or recompute) forward sees: the step's rows, online pairs
        one pair per prompt.
      group: rows per group (G; 1 offline).
      group_minibatches: minibatches permute whole groups (a shared prompt or skipping).
      shards: the mesh's batch shards (data × fsdp).
    """

    per_step: int
    per_update: int
    minibatches: int
    epochs: int
    micro_batches: int
    forward: int
    group: int
    group_minibatches: bool
    shards: int


@dataclasses.dataclass(frozen=True)
class Needs:
    """What the update needs beside the policy.

    Attributes:
      reference: a frozen reference forward over the learner batch (the loss's KL or
        implicit reward; PPO's KL-shaped reward).
      reference_in_loss: the loss reads the reference's entries (else only the strategy does).
      critic: a value model with its own update (PPO).
      correction: the batch entry ``rollout.correction`` adds (``is_weights`` or
        ``proximal_logp``) after a recompute forward; None when off.
      traced_hparams: the loss hyperparameters a schedule moves (traced, no recompile).
      skip_zero: the step skips micro-batches whose loss and gradient are exactly zero.
      teacher: a frozen teacher model scores the samples (distillation).
      teacher_in_loss: the loss runs the teacher inside the step (``frozen["teacher"]``;
        GKD); else the strategy computes the teacher's log-probs before the update.
    """

    reference: bool
    reference_in_loss: bool
    critic: bool
    correction: str | None
    traced_hparams: tuple[str, ...]
    skip_zero: bool
    teacher: bool = False
    teacher_in_loss: bool = False


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A run config resolved once (module docstring).

    Attributes:
      cfg: the validated config it was resolved from.
      algo: the algorithm's registry entry. spec: its loss's :class:`LossSpec`.
      loss_config: the loss's validated config dataclass.
      logprobs: how the policy's forwards compute log-probs.
      mesh: the learner mesh's axis sizes by name.
      rows: :class:`Rows`. needs: :class:`Needs`.
      pack: the learner's packing (``logprobs.pack``) or None.
      placement: the role → layout map (learner, sampler, reference, teacher, critic).
      max_staleness: ``rollout.max_staleness`` (0: synchronous).
      layout: the batch the policy's train step takes (before packing).
      companion_fields: entries a companion update reads beside ``layout`` (PPO's critic);
        the strategy hands them over, the learner drops them for the policy's step.
    """

    cfg: RunConfig
    algo: Algorithm
    spec: LossSpec
    loss_config: Any
    logprobs: LogprobSettings
    mesh: Mapping[str, int]
    rows: Rows
    needs: Needs
    pack: PackSpec | None
    placement: Placement
    max_staleness: int
    layout: BatchLayout
    companion_fields: tuple[BatchField, ...] = ()

    @property
    def online(self) -> bool:
        """True for online RL (rollout → reward → update)."""
        return self.algo.online

    @property
    def input_layout(self) -> BatchLayout:
        """The batch before the reference's and the correction's entries: what the reference
        forward reads."""
        return BatchLayout(self.layout.kind, KIND_FIELDS[self.layout.kind])

    @property
    def handover_layout(self) -> BatchLayout:
        """What a strategy hands the learner: the step's layout with the companion's entries
        and without the correction's (added after the hand-over)."""
        base = self.layout.without(
            *(() if self.needs.correction is None else (self.needs.correction,))
        )
        return base.with_fields(*self.companion_fields)

    @property
    def learner_layout(self) -> BatchLayout:
        """What the learner receives: the step's layout with the companion's entries."""
        return self.layout.with_fields(*self.companion_fields)

    @property
    def step_layout(self) -> BatchLayout:
        """The batch the compiled step takes: :attr:`layout`, packed with ``logprobs.pack``."""
        return packed_layout(self.layout) if self.pack is not None else self.layout

    def zero_batch_fn(self):
        """The step's ``skip_fn`` (``is_zero(batch)``) when micro-batches may be skipped."""
        if not self.needs.skip_zero:
            return None
        assert self.spec.zero_batch_fn is not None
        return self.spec.zero_batch_fn(self.loss_config)


def mesh_sizes(mesh: Any) -> dict[str, int]:
    """Axis sizes by name of a ``Mesh`` or a dict (missing axes are 1)."""
    shape = mesh if isinstance(mesh, Mapping) else mesh.shape
    return {k: int(shape.get(k, 1)) for k in MESH_SIZES}


def _plan_rows(cfg: RunConfig, lc: Any, logprobs: Any, shards: int) -> Rows:
    """How a step's rows split into updates, minibatches and micro-batches (:class:`Rows`)."""
    r = cfg.rollout
    if cfg.is_online:
        micro = update_micro_batches(cfg, lc, shards=shards)
        per_step = r.prompts_per_step * r.group_size
        minibatches = 1 if cfg.algo.pairs_per_group else r.minibatches
        per_update = r.prompts_per_step if cfg.algo.pairs_per_group else per_step // minibatches
        return Rows(
            per_step=per_step,
            per_update=per_update,
            minibatches=minibatches,
            epochs=r.epochs,
            micro_batches=micro,
            forward=per_update if cfg.algo.pairs_per_group else per_step,
            group=r.group_size,
            group_minibatches=micro > 1 or logprobs.prompt_group_size > 1,
            shards=shards,
        )
    return Rows(
        per_step=cfg.train.batch_size,
        per_update=cfg.train.batch_size,
        minibatches=1,
        epochs=1,
        micro_batches=cfg.train.micro_batches,
        forward=cfg.train.batch_size,
        group=1,
        group_minibatches=False,
        shards=shards,
    )


def _plan_layout(
    cfg: RunConfig, spec: Any, lc: Any, *, ref_in_loss: bool, correction: str | None
) -> BatchLayout:
    """The fields of the batch the update takes: the loss's kind, plus the reference's
    log-probs, the correction's weights and the recorded routing where they are used."""
    kind = spec.layout_kind(lc)
    layout = BatchLayout(kind, KIND_FIELDS[kind])
    if ref_in_loss:
        layout = layout.with_fields(*REFERENCE_FIELDS[kind])
    if correction is not None:
        layout = layout.with_fields(*float_fields(correction))
    if cfg.is_online and cfg.rollout.records_routing:
        if spec.batch_kind == "preference" and not cfg.logprobs.pack:
            layout = layout.with_fields(*PAIR_ROUTING_FIELDS)
        elif spec.batch_kind == "rl":
            layout = layout.with_fields(ROUTING_FIELD)
        else:
            raise ConfigError(
                f"rollout.routing_replay / record_routing: the {cfg.algorithm} update takes "
                f"{spec.batch_kind!r} batches{' packed' if cfg.logprobs.pack else ''}; "
                f"routing is replayed in 'rl' batches and unpacked preference pairs only"
            )
    return layout


def plan_run(
    cfg: RunConfig, mesh: Any, *, processes: int | None = None, platform: str | None = None
) -> RunPlan:
    """Resolve ``cfg`` for a learner mesh (a ``Mesh`` or its axis sizes) into a :class:`RunPlan`.

    Args:
      processes: how many processes run the job (default: the mesh's devices' processes, or
        ``jax.process_count()`` for axis sizes).
      platform: the devices' platform (default: the mesh's, or ``jax.devices()``'): the
        sampler's weights default to bfloat16 on ``tpu`` and ``gpu``.

    Raises:
      ConfigError: the ``loss`` or ``schedules`` section does not fit the algorithm's loss,
        or the rollout's layout does not fit the devices.
    """
    algo, spec = cfg.algo, cfg.algo.loss_spec()
    sizes = mesh_sizes(mesh)
    placement = run_placement(cfg, mesh, processes=processes, platform=platform)
    lc = loss_config(cfg)
    logprobs = logprob_settings(cfg)
    shards = sizes["data"] * sizes["fsdp"]
    r = cfg.rollout
    ref_in_loss = spec.reference_fn is not None and spec.uses_reference(lc)
    correction = None
    if cfg.is_online and r.correction is not None:
        correction = "proximal_logp" if r.correction.decoupled else "is_weights"
    rows = _plan_rows(cfg, lc, logprobs, shards)
    skip_zero = (
        cfg.is_online
        and rows.micro_batches > 1
        and spec.zero_batch_fn is not None
        and spec.zero_batch_fn(lc) is not None
    )
    needs = Needs(
        reference=ref_in_loss or (algo.critic and spec.reference_fn is not None),
        reference_in_loss=ref_in_loss,
        critic=algo.critic,
        correction=correction,
        traced_hparams=tuple(s.name for s in cfg.schedules),
        skip_zero=skip_zero,
        teacher=algo.teacher,
        teacher_in_loss=algo.teacher and spec.uses_teacher(lc),
    )
    layout = _plan_layout(cfg, spec, lc, ref_in_loss=ref_in_loss, correction=correction)
    return RunPlan(
        cfg=cfg,
        algo=algo,
        spec=spec,
        loss_config=lc,
        logprobs=logprobs,
        mesh=sizes,
        rows=rows,
        needs=needs,
        pack=PackSpec(r.max_new_tokens, cfg.logprobs.pack_length)
        if cfg.is_online and cfg.logprobs.pack
        else None,
        placement=placement,
        max_staleness=r.max_staleness if cfg.is_online else 0,
        layout=layout,
        companion_fields=CRITIC_FIELDS if algo.critic else (),
    )


def plan_for_model(
    plan: RunPlan, config: Any, *, chip: Chip | None, resident_bytes: float = 0.0
) -> RunPlan:
    """``plan`` with the sampler's tensor degree chosen for the model ``config`` on ``chip``
    (``rollout.tensor: auto``; :func:`~jaxrl_llm.parallel.placement.resolve_sampler`): the
    step's rollout rows, each ``data.max_length`` + ``rollout.max_new_tokens`` cache slots,
    in the HBM the learner's ``resident_bytes`` leave when colocated. Unchanged offline or
    with a given degree."""
    if not plan.online or not plan.placement.tensor_auto:
        return plan
    cfg, placement = plan.cfg, plan.placement
    rows = plan.rows.per_step
    tokens = (cfg.data.max_length or 0) + cfg.rollout.max_new_tokens
    free = None
    if chip is not None and placement.colocated:
        free = max(chip.hbm_bytes - resident_bytes, 0.0)
    placement = resolve_sampler(
        placement, config, rows=rows, tokens=tokens, chip=chip, free_bytes=free
    )
    return dataclasses.replace(plan, placement=placement)


# ----- where each role lives (called once, by plan_run) --------------------------------------


def run_placement(
    cfg: RunConfig, mesh: Any, *, processes: int | None = None, platform: str | None = None
) -> Placement:
    """The run's role → layout map (:func:`~jaxrl_llm.parallel.placement.plan_placement`):
    the learner on ``mesh``, the sampler on the learner's devices (``rollout.devices: 0``) or
    the last n, tensor parallel over ``rollout.tensor`` within each process, its weights in
    ``rollout.dtype`` (bfloat16 on TPU and GPU when unset, the model's own on CPU). Read it
    from :attr:`RunPlan.placement`."""
    sizes = mesh_sizes(mesh)
    devices = getattr(mesh, "devices", None)
    if processes is None:
        if devices is not None:
            processes = len({getattr(d, "process_index", 0) for d in devices.flat})
        else:
            processes = jax.process_count()
    if platform is None:
        platform = devices.flat[0].platform if devices is not None else jax.devices()[0].platform
    r = cfg.rollout
    online = cfg.is_online
    dtype = r.dtype if online else None
    if dtype is None:
        dtype = "bfloat16" if platform in ("tpu", "gpu") else None
    n_rollout = r.devices if online else 0
    # one sampler program over several processes: the static engine's single-turn loop, in
    # step with the learner (the paged engine's host loop and the environments' replies are
    # each process's own; a background producer would interleave its programs with the
    # learner's differently on each process)
    one_program = r.engine == "static" and cfg.env is None and r.max_staleness == 0
    placement = plan_placement(
        sizes,
        num_devices=int(np.prod(list(sizes.values()))) + n_rollout,
        processes=processes,
        rollout_devices=n_rollout,
        tensor=r.tensor if online else 1,
        dtype=dtype,
        # a TPU slice's chips all share the inter-chip links: auto may span its hosts
        cross_process=platform == "tpu" and one_program,
    )
    if placement.sampler.spans_processes and not one_program:
        raise ConfigError(
            f"rollout.tensor={r.tensor} spans processes (each has "
            f"{placement.sampler.count // processes} sampler devices): only the static "
            f"engine's single-turn, synchronous rollouts run as one program over the job; "
            f"use a degree that divides a process's devices"
        )
    return placement
