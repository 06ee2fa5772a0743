"""Where a rollout's rows live: split over the batch axes of the mesh the weights are on.

A sampler is given its mesh (the sampler's layout of the run's placement,
:mod:`jaxrl_llm.parallel.placement`: ``data`` replicas × ``tensor``) and splits its rows over
that mesh's batch axes, ``data`` and ``fsdp`` (:data:`jaxrl_llm.models.layout.ACTIVATION_RULES`'
``batch``). Each replica then prefills and decodes only its own rows, with its own slice of
the KV cache, split by KV heads over ``tensor``. Without this the decode batch was placed
nowhere and XLA replicated it: 8 forced CPU devices decoded every row on every device, 7×
slower than one device (issue 30).

Rows are dealt out in order, so a group (G consecutive rows, prompt-major) stays on one device
when the prompts split evenly; :func:`pad_rows` pads the prompts to a multiple of the split
with copies of the last prompt, whose rows are dropped afterwards. Each row's tokens are drawn
with its own key (:func:`jaxrl_llm.sampling.row_keys`), so the layout does not change which
tokens a row draws, only which device draws them.

Used by the static engine (:mod:`.static_generate`, :mod:`.decode`); the jitted programs read
the mesh from the ambient mesh that :func:`on_rows_mesh` binds, as the model's own activation
placements do (:func:`jaxrl_llm.models.layout.layout_mesh`). The paged engine (:mod:`.engine`)
runs one data-parallel replica per position on the batch axes (:func:`replica_axes`), all of
them in one program over the mesh (:func:`jaxrl_llm.sampling.slots.over_replicas`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.models.layout import AnyMesh, activation_spec, layout_mesh


def row_split(mesh: AnyMesh | None) -> int:
    """How many shards the rows split into on ``mesh``: the product of its batch axes' sizes
    (1 without a mesh)."""
    if mesh is None:
        return 1
    spec = activation_spec(("batch",), mesh, (0,))[0]
    names = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    return int(np.prod([mesh.shape[n] for n in names], dtype=np.int64))


def pad_rows(n: int, split: int) -> int:
    """How many rows to add to ``n`` so that ``split`` divides it."""
    return -n % split


def rows_spec(
    mesh: AnyMesh, shape: tuple[int, ...], axis: int = 0, tensor: int | None = None
) -> PartitionSpec:
    """``PartitionSpec`` with dimension ``axis`` (rows) over the batch axes, dimension
    ``tensor`` (if any: a KV cache's KV heads, logits' vocabulary) over the ``tensor`` axis
    and every other dimension whole; a dimension its split does not divide is left whole."""
    spec: list[Any] = [None] * len(shape)
    spec[axis] = activation_spec(("batch",), mesh, (shape[axis],))[0]
    if spec[axis] is PartitionSpec.UNCONSTRAINED:
        spec[axis] = None
    if tensor is not None:
        t = int(dict(mesh.shape).get("tensor", 1))
        if t > 1 and shape[tensor] % t == 0:
            spec[tensor] = "tensor"
    return PartitionSpec(*spec)


def put_rows(x: Any, mesh: Mesh) -> jax.Array:
    """Host side: ``x`` (rows first) placed with its rows split over ``mesh``'s batch axes."""
    return jax.device_put(x, NamedSharding(mesh, rows_spec(mesh, np.shape(x))))


def constrain_rows(x: jax.Array, axis: int = 0, tensor: int | None = None) -> jax.Array:
    """Inside a jitted sampler: ``x`` with dimension ``axis`` split over the ambient mesh's
    batch axes, dimension ``tensor`` (if given) over its ``tensor`` axis, the rest whole
    (:func:`rows_spec`; ``x`` as it is without an ambient mesh of > 1 device)."""
    mesh = layout_mesh()
    if mesh is None or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(
        x, NamedSharding(mesh, rows_spec(mesh, tuple(x.shape), axis, tensor))
    )


def per_row(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` run on each device's own rows inside a jitted sampler: every argument and
    output is rows-first, split over the ambient mesh's batch axes and then its ``tensor``
    axis where the rows divide (``jax.shard_map``); plain ``fn(*args)`` without an ambient
    mesh of > 1 device.

    For per-row operations that XLA's partitioner would otherwise gather whole: it replicates
    ``lax.top_k`` (the token filters' top-256) over every device, all-gathering the ``[N, V]``
    logits at every decode step. Splitting a replica's rows over its ``tensor`` devices too
    turns the vocabulary-split logits into whole rows with one all-to-all, and each device
    filters and samples 1 / tensor of the rows instead of all of them.
    """
    mesh = layout_mesh()
    if mesh is None or mesh.size == 1:
        return fn(*args)
    n = int(args[0].shape[0])
    spec = rows_spec(mesh, (n,))
    names = () if spec[0] is None else (spec[0],) if isinstance(spec[0], str) else spec[0]
    t = int(dict(mesh.shape).get("tensor", 1))
    split = int(np.prod([mesh.shape[a] for a in names], dtype=np.int64))
    if t > 1 and n % (split * t) == 0:
        names = (*names, "tensor")
    if not names:  # rows the split does not divide: whole
        return fn(*args)
    rows = PartitionSpec(names[0] if len(names) == 1 else tuple(names))
    return jax.shard_map(fn, mesh=mesh, in_specs=rows, out_specs=rows)(*args)


def replica_axes(mesh: AnyMesh | None) -> tuple[str, ...]:
    """The paged engine's replica axes: ``mesh``'s batch axes (``data``, ``fsdp``) of more
    than one position, in mesh order; one replica per position on them, holding the devices
    that share it (``tensor``, ``expert`` and ``context`` stay inside a replica). ``()``
    without a mesh or when the batch axes are a single position (one replica)."""
    if mesh is None:
        return ()
    return tuple(n for n in mesh.axis_names if n in ("data", "fsdp") and mesh.shape[n] > 1)


@contextlib.contextmanager
def on_rows_mesh(mesh: Mesh | None) -> Iterator[None]:
    """Bind ``mesh`` as the ambient mesh while the jitted samplers run (nothing when None)."""
    if mesh is None:
        yield
        return
    with jax.set_mesh(mesh):
        yield
