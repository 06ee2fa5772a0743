"""The sampler's copy of the weights: made from the learner's once per policy version, in the
sampler's layout (:class:`~jaxrl_llm.parallel.placement.RoleLayout`) and dtype, by one jitted
program (:class:`SamplerCopy`; module docstring of :mod:`jaxrl_llm.parallel.placement`)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxrl_llm.parallel.placement import RoleLayout
from jaxrl_llm.parallel.rules import DEFAULT_RULES, MeshAxes, logical_to_sharding


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
