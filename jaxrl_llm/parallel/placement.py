"""Where each role of a run lives: the placement map, and the sampler's copy of the weights.

A run has five roles: the **learner** (the policy's train state and update), the **sampler**
(the rollouts' decode loop), and the frozen **reference**, **teacher** and **critic**
forwards. :class:`Placement` holds one :class:`RoleLayout` per role, as data: which devices,
which mesh axis sizes, how many times the layout repeats (once per process for the sampler of
a multi-process run) and the weights' dtype. :func:`jaxrl_llm.train.config.plan.plan_run`
resolves it once; the trainers, the producer, both engines and ``jaxrl-llm compile`` read it
(Tunix keeps the same map as data: ``ClusterConfig.role_to_mesh``).

The learner, reference, teacher and critic share the learner's mesh (``mesh``: rows over
``data × fsdp``, weights by the rule table). The sampler does not: under FSDP a decode loop
on the learner's layout all-gathers every layer's weights at every generated token (13.1 GB
per token step for an 8B model on 8 chips, BENCHMARKS.md). Leading RL stacks reshard the
weights **once per policy version** into an inference layout instead (verl's hybrid engine,
NeMo-RL's refit, Tunix / MaxText with vLLM-TPU's ``reshard_pytree``), and so does this one:

* the sampler's mesh has axes ``data`` (replicas) × ``tensor`` (``rollout.tensor``): heads,
  MLP columns, the vocabulary and the KV cache's KV heads split over ``tensor`` (Megatron-LM,
  Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053), whole groups of rows per replica;
* ``tensor`` stays within a process (a host: its chips share the fast links, and each
  process samples its own share of the prompts), so the replicas are the rest;
* :class:`SamplerCopy` makes the sampler's weights from the learner's with one jitted program
  (``out_shardings`` = the sampler's layout, cast to the rollout dtype) after each update; the
  previous copy's buffers are donated to it when nothing reads them any more. No weight
  collective runs inside the decode loop: it reads whole tensor-parallel shards.

``rollout.tensor: auto`` picks the degree from a model of one decode step
(:func:`choose_sampler_tensor`): bytes read per chip ``W / t + rows × KV bytes / D`` over the
HBM bandwidth, plus ``2 L`` all-reduces of the rows' hidden states per step (latency and
bytes over the interconnect), among the degrees that fit HBM.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel.mesh import MESH_AXES, make_mesh, mesh_shape
from jaxrl_llm.parallel.rules import DEFAULT_RULES, MeshAxes, logical_to_sharding

ROLES: tuple[str, ...] = ("learner", "sampler", "reference", "teacher", "critic")

#: The time one all-reduce of a decode step's hidden states takes on top of its bytes
#: (launch and synchronisation). An assumption of the model, not a measurement: 10 µs is
#: the order of one small ICI / NVLink collective.
ALLREDUCE_LATENCY_S = 10e-6


@dataclasses.dataclass(frozen=True)
class RoleLayout:
    """Where one role lives.

    Attributes:
      role: one of :data:`ROLES`.
      sizes: the mesh's axis sizes by name (:data:`~jaxrl_llm.parallel.MESH_AXES`).
      first: index of the role's first device in the run's device list.
      count: how many devices the role spans (all processes together).
      per_process: the layout repeats once per process (the sampler of a multi-process run:
        ``sizes`` are one process's), each process running its own programs on its devices.
      dtype: the role's weights' dtype (None: as the learner holds them).
      processes: how many processes the role's devices belong to.
    """

    role: str
    sizes: Mapping[str, int]
    first: int
    count: int
    per_process: bool = False
    dtype: str | None = None
    processes: int = 1

    @property
    def spans_processes(self) -> bool:
        """One program over several processes' devices (a tensor group spans processes)."""
        return self.processes > 1 and not self.per_process

    @property
    def tensor(self) -> int:
        """The tensor-parallel degree."""
        return int(self.sizes.get("tensor", 1))

    @property
    def replicas(self) -> int:
        """Data-parallel positions (``data × fsdp``) of one layout (one process's when
        ``per_process``)."""
        return int(self.sizes.get("data", 1)) * int(self.sizes.get("fsdp", 1))

    def devices(self, devices: Sequence[Any] | None = None) -> list:
        """The role's devices of ``devices`` (default ``jax.devices()``), ordered by process."""
        devices = list(jax.devices() if devices is None else devices)
        mine = devices[self.first : self.first + self.count]
        return sorted(mine, key=lambda d: (getattr(d, "process_index", 0), d.id))

    def mesh(self, devices: Sequence[Any] | None = None) -> Mesh:
        """The role's mesh over all its devices, process by process. ``per_process``: the
        processes' meshes side by side along ``data`` (a process's devices are one block of
        replicas, a tensor group never spans two), so that one program can lay weights out
        for every process at once (:class:`SamplerCopy`)."""
        mine = self.devices(devices)
        sizes = {k: int(self.sizes.get(k, 1)) for k in MESH_AXES}
        if self.per_process:
            sizes["data"] = -1
        shape = mesh_shape(len(mine), **sizes)
        if not self.per_process and len(mine) == len(jax.devices()):
            return make_mesh(devices=mine, **sizes)  # JAX's topology-aware order
        grid = np.asarray(mine, dtype=object).reshape(shape)
        return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))

    def describe(self) -> str:
        """One line: ``data=2 × tensor=4 on devices 0..7 (bfloat16)``."""
        axes = " × ".join(f"{k}={v}" for k, v in self.sizes.items() if v > 1) or "1 device"
        where = f"devices {self.first}..{self.first + self.count - 1}"
        scope = " per process" if self.per_process else ""
        if self.spans_processes:
            scope = f" over {self.processes} processes"
        return f"{axes}{scope} on {where}{f' ({self.dtype})' if self.dtype else ''}"


@dataclasses.dataclass(frozen=True)
class Placement:
    """The role → layout map of a run (module docstring).

    Attributes:
      roles: one :class:`RoleLayout` per name of :data:`ROLES`.
      tensor_auto: the sampler's tensor degree is still to be chosen (``rollout.tensor:
        auto``) once the model is known (:func:`resolve_sampler`).
      why: how the sampler's layout was chosen (printed by the run).
      cross_process: ``auto`` may choose a tensor degree that spans processes.
    """

    roles: Mapping[str, RoleLayout]
    tensor_auto: bool = False
    why: str = ""
    cross_process: bool = False

    def __getitem__(self, role: str) -> RoleLayout:
        return self.roles[role]

    @property
    def sampler(self) -> RoleLayout:
        """The sampler's layout."""
        return self.roles["sampler"]

    @property
    def learner(self) -> RoleLayout:
        """The learner's layout."""
        return self.roles["learner"]

    @property
    def colocated(self) -> bool:
        """The sampler uses the learner's devices, in turn with it."""
        s, learner = self.sampler, self.learner
        return s.first == learner.first and s.count == learner.count

    @property
    def sampler_reads_learner(self) -> bool:
        """The sampler's layout and dtype are the learner's own: it reads the learner's arrays
        as they are, with no copy (one device, a data-parallel learner sampled at tensor=1 on
        CPU, or the fallback when no copy fits)."""
        s, learner = self.sampler, self.learner
        same = {k: int(s.sizes.get(k, 1)) for k in MESH_AXES} == {
            k: int(learner.sizes.get(k, 1)) for k in MESH_AXES
        }
        return self.colocated and same and s.dtype is None and not s.per_process


def plan_placement(
    learner: Mapping[str, int],
    *,
    num_devices: int,
    processes: int = 1,
    rollout_devices: int = 0,
    tensor: int | str = 1,
    dtype: str | None = None,
    cross_process: bool = False,
) -> Placement:
    """The placement of a run whose learner mesh has axis sizes ``learner``.

    Args:
      learner: the learner mesh's axis sizes.
      num_devices: every device of the run (all processes).
      processes: how many processes share them (each with ``num_devices / processes``).
      rollout_devices: ``rollout.devices``: 0 = the sampler on the learner's devices (in
        turn, colocated), n = the last n devices (the learner on the others).
      tensor: ``rollout.tensor``: an int, or ``"auto"`` (chosen once the model is known).
        A degree that divides a process's sampler devices keeps tensor parallelism within
        each process (each samples its own share of the prompts); a multiple of them spans
        whole processes, and the sampler is one program over the job (a TPU slice, whose
        chips all share the inter-chip links).
      dtype: the sampler's weights' dtype (None: the learner's compute dtype).
      cross_process: ``auto`` may choose a degree that spans processes (TPU).

    Raises:
      ConfigError: a tensor degree that neither divides a process's sampler devices nor is a
        multiple of them dividing all of them.
    """
    n = int(rollout_devices)
    learner_count = num_devices - n
    s_first, s_count = (learner_count, n) if n else (0, num_devices)
    auto = tensor == "auto"
    t = 1 if auto else int(tensor)
    sampler = sampler_layout(t, s_first, s_count, processes, dtype)
    learn = RoleLayout("learner", dict(learner), 0, learner_count, processes=processes)
    roles = {"learner": learn, "sampler": sampler}
    for role in ("reference", "teacher", "critic"):
        roles[role] = dataclasses.replace(learn, role=role)
    why = "rollout.tensor: auto, chosen when the model is known" if auto else f"rollout.tensor={t}"
    return Placement(roles, tensor_auto=auto, why=why, cross_process=cross_process)


def sampler_layout(t: int, first: int, count: int, processes: int, dtype: str | None) -> RoleLayout:
    """The sampler's :class:`RoleLayout` at tensor degree ``t`` on devices ``first`` ..
    ``first + count − 1`` of ``processes`` processes (:func:`plan_placement`).

    Raises:
      ConfigError: ``t`` neither divides a process's devices nor is a multiple of them that
        divides ``count``.
    """
    local = count // processes
    if t >= 1 and local % t == 0:  # within each process: one layout per process
        per = processes > 1
        return RoleLayout(
            "sampler", _sizes(data=local // t, tensor=t), first, count, per, dtype, processes
        )
    if t > local and t % local == 0 and count % t == 0:  # whole processes per tensor group
        return RoleLayout(
            "sampler", _sizes(data=count // t, tensor=t), first, count, False, dtype, processes
        )
    raise ConfigError(
        f"rollout.tensor={t} must divide the sampler's devices per process ({local}), or be "
        f"a multiple of them that divides all {count}"
    )


def _sizes(**sizes: int) -> dict[str, int]:
    return {k: int(sizes.get(k, 1)) for k in MESH_AXES}


# ----- choosing the sampler's tensor degree --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Chip:
    """What the decode model needs of a chip: HBM bytes and bandwidth, interconnect bandwidth
    (bytes/s one way or both, as the datasheet gives it; None: unknown)."""

    name: str
    hbm_bytes: float
    hbm_bandwidth: float
    link_bandwidth: float | None


@dataclasses.dataclass(frozen=True)
class DecodeCost:
    """One tensor degree in the decode model (:func:`choose_sampler_tensor`)."""

    tensor: int
    bytes_per_chip: float
    step_s: float
    fits: bool


def decode_step_cost(
    t: int,
    *,
    devices: int,
    weight_bytes: float,
    kv_bytes_per_row: float,
    rows: int,
    layers: int,
    hidden: int,
    chip: Chip,
    free_bytes: float | None = None,
) -> DecodeCost:
    """The modeled seconds of one decode step at tensor degree ``t`` on ``devices`` sampler
    devices: ``(W / t + rows_per_replica × KV / t) / HBM bandwidth`` (each chip reads its
    weight shard and its rows' KV heads once per step) + ``2 L`` all-reduces of the replica's
    hidden states ``[rows_per_replica, hidden]`` in bf16 (ring: ``2 (t−1)/t`` of the bytes
    over the link, plus :data:`ALLREDUCE_LATENCY_S` each) when ``t > 1``."""
    replicas = max(devices // t, 1)
    rows_here = -(-rows // replicas)
    held = weight_bytes / t + rows_here * kv_bytes_per_row / t
    step = held / chip.hbm_bandwidth
    if t > 1:
        ar_bytes = 2 * (t - 1) / t * rows_here * hidden * 2
        link = chip.link_bandwidth or chip.hbm_bandwidth
        step += 2 * layers * (ALLREDUCE_LATENCY_S + ar_bytes / link)
    budget = chip.hbm_bytes if free_bytes is None else free_bytes
    return DecodeCost(t, held, step, held <= budget)


def choose_sampler_tensor(
    candidates: Sequence[int], chip: Chip | None, **model: Any
) -> tuple[int, str, list[DecodeCost]]:
    """``(t, why, costs)``: the tensor degree among ``candidates`` with the fastest modeled
    decode step that fits (:func:`decode_step_cost`; ``model``: its keywords), the reason in
    one line, and every candidate's cost. Without a chip model (CPU devices, which share one
    host's memory and cores: splitting weights buys no bandwidth) the smallest degree."""
    if chip is None or not chip.hbm_bandwidth or not candidates:
        t = min(candidates) if candidates else 1
        return t, f"tensor={t}: no chip model for these devices (CPU), the smallest degree", []
    costs = [decode_step_cost(t, chip=chip, **model) for t in candidates]
    fits = [c for c in costs if c.fits]
    if not fits:
        best = min(costs, key=lambda c: c.bytes_per_chip)
        return (
            best.tensor,
            (
                f"tensor={best.tensor}: no degree fits {chip.name}'s HBM; the one holding the "
                f"least ({best.bytes_per_chip / 1e9:.1f} GB per chip)"
            ),
            costs,
        )
    best = min(fits, key=lambda c: c.step_s)
    base = costs[0]
    return (
        best.tensor,
        (
            f"tensor={best.tensor}: modeled decode step {best.step_s * 1e3:.2f} ms "
            f"({best.bytes_per_chip / 1e9:.2f} GB read per chip) against "
            f"{base.step_s * 1e3:.2f} ms at tensor={base.tensor}, on {chip.name}"
        ),
        costs,
    )


def tensor_candidates(local_devices: int, heads: int, kv_heads: int) -> list[int]:
    """Tensor degrees that divide a process's devices, the attention heads and the KV heads
    (so the KV cache splits by KV heads and nothing falls back to replication)."""
    return [
        t
        for t in range(1, local_devices + 1)
        if local_devices % t == 0 and heads % t == 0 and kv_heads % t == 0
    ]


def auto_tensor(
    config: Any,
    *,
    devices: int,
    local_devices: int,
    rows: int,
    tokens: int,
    chip: Chip | None,
    dtype: str | None,
    free_bytes: float | None = None,
    cross_process: bool = False,
) -> tuple[int, str]:
    """``(t, why)``: the sampler's tensor degree for the model ``config`` (a
    :class:`~jaxrl_llm.models.ModelConfig`) on ``devices`` sampler devices, ``local_devices``
    of them per process, decoding ``rows`` rows (all processes') of ``tokens`` cache slots in
    ``dtype`` (:func:`choose_sampler_tensor` over :func:`tensor_candidates`: divisors of
    ``local_devices``, and with ``cross_process`` multiples of it that divide ``devices``).
    What ``rollout.tensor: auto`` runs with, and what ``jaxrl-llm memory`` and ``compile``
    estimate with."""
    itemsize = jnp.dtype(dtype or "bfloat16").itemsize
    k, e = config.store_kv_heads, config.store_head_dim
    model = dict(
        devices=devices,
        weight_bytes=config.num_params() * itemsize,
        kv_bytes_per_row=2 * config.num_kv_layers * k * e * itemsize * tokens,
        rows=rows,
        layers=config.num_layers,
        hidden=config.hidden_size,
        free_bytes=free_bytes,
    )
    cands = tensor_candidates(local_devices, config.num_heads, config.num_kv_heads)
    if cross_process:
        cands += [
            t
            for t in range(2 * local_devices, devices + 1, local_devices)
            if devices % t == 0 and config.num_heads % t == 0 and config.num_kv_heads % t == 0
        ]
    t, why, costs = choose_sampler_tensor(cands, chip, **model)
    if chip is not None and costs and not any(c.fits for c in costs):
        return 0, (
            f"no tensor degree fits a copy of the weights and the KV cache in {chip.name}'s "
            f"HBM ({min(c.bytes_per_chip for c in costs) / 1e9:.1f} GB per chip at best): "
            f"decoding on the learner's layout"
        )
    return t, why


def resolve_sampler(
    placement: Placement,
    config: Any,
    *,
    rows: int,
    tokens: int,
    chip: Chip | None,
    free_bytes: float | None = None,
) -> Placement:
    """``placement`` with the sampler's tensor degree chosen (``rollout.tensor: auto``,
    :func:`auto_tensor`) for the model ``config`` decoding ``rows`` rows (all processes') of
    ``tokens`` cache slots; unchanged when the degree was given."""
    if not placement.tensor_auto:
        return placement
    s = placement.sampler
    t, why = auto_tensor(
        config,
        devices=s.count,
        local_devices=s.count // s.processes,
        rows=rows,
        tokens=tokens,
        chip=chip,
        dtype=s.dtype,
        free_bytes=free_bytes,
        cross_process=placement.cross_process,
    )
    if t == 0:  # nothing fits whole: the learner's own layout (weights gathered per layer)
        learn = placement.learner
        one_program = placement.cross_process or s.processes == 1
        if one_program and (s.first, s.count) == (learn.first, learn.count):
            # the learner's own arrays, as they are (no copy: none fits)
            sampler = dataclasses.replace(learn, role="sampler", dtype=None)
        else:
            t, why = (
                min(tensor_candidates(local_devices_of(s), config.num_heads, config.num_kv_heads)),
                why + "; the learner's layout is not one the sampler can take here, tensor=1",
            )
            sampler = sampler_layout(t, s.first, s.count, s.processes, s.dtype)
    else:
        sampler = sampler_layout(t, s.first, s.count, s.processes, s.dtype)
    roles = {**placement.roles, "sampler": sampler}
    return dataclasses.replace(
        placement, roles=roles, tensor_auto=False, why=f"rollout.tensor: auto → {why}"
    )


def local_devices_of(layout: RoleLayout) -> int:
    """A role's devices per process."""
    return layout.count // max(layout.processes, 1)


def kind_chip(kind: str) -> Chip | None:
    """The :class:`Chip` of a device kind as ``jaxrl-llm memory`` names it (``tpu-v5p``,
    ``h100``; None for ``cpu``)."""
    from jaxrl_llm.parallel.topology import TPU_HBM_BANDWIDTH, TPU_HBM_BYTES, TPU_ICI_BANDWIDTH

    if kind.startswith("tpu-"):
        g = kind[4:]
        return Chip(kind, TPU_HBM_BYTES[g], TPU_HBM_BANDWIDTH[g], TPU_ICI_BANDWIDTH[g])
    gpu = _GPUS.get(kind.upper())
    return None if gpu is None else Chip(kind, *gpu)


def host_devices(kind: str, devices: int) -> int:
    """Devices one host (process) of ``kind`` has in a job of ``devices``: 4 TPU chips per
    v4 / v5p host, 8 per v5e / v6e host up to an 8-chip slice and 4 beyond (Google Cloud's
    TPU system architecture pages), 8 GPUs per node; never more than the job has."""
    if kind in ("tpu-v4", "tpu-v5p"):
        per = 4
    elif kind.startswith("tpu-"):
        per = 8 if devices <= 8 else 4
    else:
        per = 8
    return max(min(per, devices), 1)


# ----- the sampler's copy ----------------------------------------------------------------------


class SamplerCopy:
    """Makes the sampler's weights from the learner's, once per policy version.

    One jitted program (:meth:`__call__`) lays the learner's parameters out on the sampler's
    mesh (:attr:`RoleLayout.mesh`, by the rule table) in the sampler's dtype. It runs on the
    learner's devices when the sampler shares them (colocated: no weight gather is left for
    the decode loop), else it casts on the learner's mesh and moves the result to the
    sampler's devices (``rollout.devices``). Across processes the program lays the weights out
    for every process at once and each keeps its own block (:attr:`local_mesh`): tensor
    parallel within its host, whole per replica.

    Args:
      layout: the sampler's :class:`RoleLayout`.
      axes: the parameters' logical axes (:func:`jaxrl_llm.models.param_logical_axes`).
      devices: the run's devices (default ``jax.devices()``; abstract TPU devices to compile).
      rules: the logical-axis rule table.
    """

    def __init__(
        self,
        layout: RoleLayout,
        axes: Any,
        *,
        devices: Sequence[Any] | None = None,
        rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
    ):
        self.layout = layout
        self.axes = axes
        self.rules = rules
        self.mesh = layout.mesh(devices)
        self.local_mesh = _local_block(self.mesh) if layout.per_process else self.mesh
        self.last_seconds, self.last_bytes = 0.0, 0
        self._programs: dict[Any, Any] = {}
        self._identity: dict[Any, bool] = {}
        self._previous: Any = None

    @property
    def engine_mesh(self) -> Mesh | None:
        """The mesh the engines sample on: :attr:`local_mesh`, None for one device (a
        one-device program, as without a mesh)."""
        return self.local_mesh if self.local_mesh.size > 1 else None

    def shardings(self, params: Any) -> Any:
        """The sampler's ``NamedSharding`` per leaf of ``params`` (on :attr:`mesh`)."""
        return logical_to_sharding(self.axes, self.mesh, self.rules, shapes=params)

    def abstract(self, params: Any, *, local: bool = False) -> Any:
        """``params`` (arrays or ``ShapeDtypeStruct``s) as the copy's ``ShapeDtypeStruct``s:
        the sampler's dtype and shardings (``jaxrl-llm compile``); with ``local``, as this
        process's part (on :attr:`local_mesh`), which its decode loop reads."""
        dt = self._dtype
        mesh = self.local_mesh if local else self.mesh

        def one(x, s):
            return jax.ShapeDtypeStruct(x.shape, dt(x.dtype), sharding=NamedSharding(mesh, s.spec))

        return jax.tree.map(one, params, self.shardings(params))

    def program(self, params: Any, *, donate: bool = False):
        """The jitted reshard ``(params[, previous]) -> copy`` for ``params``' structure and
        shardings (made once, reused for every version). Colocated: ``out_shardings`` is the
        sampler's layout; split devices: the cast alone (the move is a ``device_put``)."""
        key = (jax.tree.structure(params), donate, self._same_devices(params))
        if key in self._programs:
            return self._programs[key]
        dt = self._dtype

        def cast(p, *previous):
            del previous  # donated: its buffers take the new copy
            return jax.tree.map(lambda x: x.astype(dt(x.dtype)), p)

        out = self.shardings(params) if key[2] else None
        fn = jax.jit(
            cast, out_shardings=out, donate_argnums=(1,) if donate else (), keep_unused=donate
        )
        self._programs[key] = fn
        return fn

    def __call__(self, params: Any, *, reuse: bool = False, copy: bool = False) -> Any:
        """The sampler's copy of ``params`` (this process's part of it across processes);
        blocks until it is there and records its seconds and bytes (:meth:`metrics`).

        When the sampler's layout and dtype are ``params``' own (one device, or a learner
        mesh that already is the sampler's), ``params`` themselves, or a plain copy with
        ``copy``.

        Args:
          reuse: donate the previous copy's buffers to this one (only when no rollout still
            reads it: the synchronous loop).
          copy: the result must not share buffers with ``params`` (a snapshot the next
            update, which donates its state, cannot overwrite).
        """
        t0 = time.perf_counter()
        if self.is_identity(params):
            self.last_seconds, self.last_bytes = 0.0, 0
            return jax.tree.map(jnp.copy, params) if copy else params
        same = self._same_devices(params)
        donate = reuse and same and self._previous is not None
        fn = self.program(params, donate=donate)
        with warnings.catch_warnings():  # a donated buffer XLA could not reuse: only a copy
            warnings.filterwarnings("ignore", message=".*donated buffers were not usable")
            out = fn(params, self._previous) if donate else fn(params)
        if not same:
            out = jax.device_put(out, self.shardings(params))
        out = jax.block_until_ready(out)
        self._previous = out if reuse else None
        self.last_seconds = time.perf_counter() - t0
        self.last_bytes = sum(x.nbytes for x in jax.tree.leaves(out))
        return _local_view(out, self.local_mesh) if self.layout.per_process else out

    def is_identity(self, params: Any) -> bool:
        """``params`` are already laid out and typed as the sampler's copy would be."""
        if self.layout.per_process:
            return False
        key = (
            jax.tree.structure(params),
            tuple(str(getattr(x, "sharding", None)) for x in jax.tree.leaves(params)[:1]),
        )
        if key not in self._identity:
            leaves = jax.tree.leaves(params)
            targets = jax.tree.leaves(self.shardings(params))
            self._identity[key] = all(
                isinstance(getattr(x, "sharding", None), jax.sharding.Sharding)
                and x.sharding.is_equivalent_to(s, x.ndim)
                and self._dtype(x.dtype) == x.dtype
                for x, s in zip(leaves, targets, strict=True)
            )
        return self._identity[key]

    def metrics(self) -> dict[str, float]:
        """The last copy's ``time/weight_sync_s`` and ``rollout/weight_sync_bytes`` ({} when
        the sampler reads the learner's weights as they are)."""
        if not self.last_bytes:
            return {}
        return {
            "time/weight_sync_s": self.last_seconds,
            "rollout/weight_sync_bytes": float(self.last_bytes),
        }

    def _dtype(self, dtype: Any) -> Any:
        if self.layout.dtype is None or not jnp.issubdtype(dtype, jnp.floating):
            return dtype
        return jnp.dtype(self.layout.dtype)

    def _same_devices(self, params: Any) -> bool:
        leaf = next(iter(jax.tree.leaves(params)), None)
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            return True
        return set(sharding.device_set) == set(self.mesh.devices.flat)


def _local_block(mesh: Mesh) -> Mesh:
    """This process's block of a per-process sampler mesh (its replicas along ``data``)."""
    mine = np.vectorize(lambda d: d.process_index == jax.process_index())(mesh.devices)
    data = mesh.axis_names.index("data")
    rows = np.nonzero(mine.any(axis=tuple(i for i in range(mine.ndim) if i != data)))[0]
    devices = np.take(mesh.devices, rows, axis=data)
    return Mesh(devices, mesh.axis_names, axis_types=mesh.axis_types)


def _local_view(tree: Any, local: Mesh) -> Any:
    """Arrays laid out on a mesh spanning processes, as arrays on this process's block of it
    (``local``) with the same ``PartitionSpec``: each process holds its replicas whole, so this
    is a view of shards already here, not a copy."""

    def view(x):
        sharding = NamedSharding(local, x.sharding.spec)
        by_device = {s.device: s.data for s in x.addressable_shards}
        return jax.make_array_from_single_device_arrays(
            x.shape, sharding, [by_device[d] for d in local.devices.flat]
        )

    return jax.tree.map(view, tree)


def sampler_free_bytes(chip: Chip, resident_bytes: float) -> float:
    """HBM left for the sampler's copy and KV cache when the learner's ``resident_bytes``
    (its train state, frozen models) stay on the same chips (colocated)."""
    return max(chip.hbm_bytes - resident_bytes, 0.0)


def tpu_chip(topology: Any) -> Chip:
    """The decode model's :class:`Chip` of a :class:`~jaxrl_llm.parallel.topology.Topology`."""
    return Chip(
        topology.name,
        float(topology.hbm_bytes_per_device),
        float(topology.hbm_bandwidth_per_device),
        topology.ici_bandwidth_per_device,
    )


# Datasheet numbers of accelerators a run may find itself on (HBM bytes, HBM bytes/s, one
# chip's interconnect bytes/s): NVIDIA's H100 SXM, H200 and A100 80GB SXM datasheets
# (NVLink 900 / 900 / 600 GB/s); TPUs from :mod:`jaxrl_llm.parallel.topology`.
_GPUS: dict[str, tuple[float, float, float]] = {
    "H200": (141e9, 4.8e12, 900e9),
    "H100": (80e9, 3.35e12, 900e9),
    "A100": (80e9, 2.039e12, 600e9),
}
_TPU_KINDS = {
    "v5 lite": "v5e",
    "v5e": "v5e",
    "v5p": "v5p",
    "v5": "v5p",
    "v6 lite": "v6e",
    "v6e": "v6e",
    "v4": "v4",
}


def device_chip(device: Any) -> Chip | None:
    """The :class:`Chip` of a real device from its ``device_kind`` (None: a CPU or an
    accelerator with no datasheet entry here)."""
    from jaxrl_llm.parallel.topology import TPU_HBM_BANDWIDTH, TPU_HBM_BYTES, TPU_ICI_BANDWIDTH

    kind = str(getattr(device, "device_kind", ""))
    if device.platform == "gpu":
        for name, (hbm, bw, link) in _GPUS.items():
            if name in kind:
                return Chip(kind, hbm, bw, link)
        return None
    if device.platform == "tpu":
        low = kind.lower()
        for key, gen in _TPU_KINDS.items():
            if key in low:
                return Chip(
                    kind, TPU_HBM_BYTES[gen], TPU_HBM_BANDWIDTH[gen], TPU_ICI_BANDWIDTH[gen]
                )
    return None
