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
* :class:`~jaxrl_llm.parallel.sampler_copy.SamplerCopy` makes the sampler's weights from the learner's with one jitted program
  (``out_shardings`` = the sampler's layout, cast to the rollout dtype) after each update; the
  previous copy's buffers are donated to it when nothing reads them any more. No weight
  collective runs inside the decode loop: it reads whole tensor-parallel shards.

``rollout.tensor: auto`` picks the degree from a model of one decode step
(:func:`jaxrl_llm.parallel.decode_model.choose_sampler_tensor`): bytes read per chip ``W / t + rows × KV bytes / D`` over the
HBM bandwidth, plus ``2 L`` all-reduces of the rows' hidden states per step (latency and
bytes over the interconnect), among the degrees that fit HBM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel.decode_model import Chip, auto_tensor, tensor_candidates
from jaxrl_llm.parallel.mesh import MESH_AXES, make_mesh, mesh_shape
from jaxrl_llm.parallel.roles import PLACED_ROLES

#: The names of the roles placed (:data:`jaxrl_llm.parallel.roles.PLACED_ROLES`, the one vocabulary).
ROLES: tuple[str, ...] = tuple(r.value for r in PLACED_ROLES)


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
