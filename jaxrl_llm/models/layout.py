"""Where the activations lie: logical axes for activations, as the weights have, and the one
helper that places an activation by them.

The weights' logical axes map to mesh axes through ``jaxrl_llm.parallel.DEFAULT_RULES``.
Activations carry logical names too (``batch``, ``length``, ``embed``, ``mlp``, ``vocab``),
with their own table, :data:`ACTIVATION_RULES`: rows go over the batch axes (``data`` and
``fsdp``), tokens over ``context``, the MLP's hidden units and the vocabulary over ``tensor``,
and the model dimension of an activation stays whole. Under FSDP that means each device holds
its own rows and the weights are all-gathered per layer; left alone, GSPMD may shard an
activation's model dimension instead, keeping every row on every device.

The mesh is explicit. :func:`constrain` takes it as an argument; the model (``mesh=``) and
the chunked log-prob ops resolve it with :func:`layout_mesh`: the mesh passed in, else the
ambient one a caller bound (``jaxrl_llm.parallel.under_mesh``, as the train step and the
policy's ``apply_fn`` do on a mesh of more than one device), else **None: no mesh, no
placement** (one device; an eager call; the samplers, which place their own arrays). A mesh of
one device places nothing either, so a single-device program is the unconstrained one, bit
for bit.

This module lives in ``models`` (as ``moe.EXPERT_AXIS`` and ``ring_attention.CONTEXT_AXIS``
do) so the model does not import ``jaxrl_llm.parallel``, which imports the model;
``jaxrl_llm.parallel`` re-exports it.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import jax
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

AnyMesh = Mesh | AbstractMesh

#: Activation logical axis -> mesh axis (or axes, or None = whole on every device).
ACTIVATION_RULES: Mapping[str, str | tuple[str, ...] | None] = types.MappingProxyType(
    {
        "batch": ("data", "fsdp"),  # rows: as the batch itself (parallel.batch_sharding)
        "length": "context",  # tokens of a row: context parallelism (ring attention)
        "embed": None,  # an activation's model dimension stays whole: rows are split instead
        "mlp": "tensor",  # the MLP's hidden units, as its weights under tensor parallelism
        "vocab": "tensor",  # logits over the vocabulary, as the unembedding
    }
)


def layout_mesh(mesh: AnyMesh | None = None) -> AnyMesh | None:
    """The mesh activations are placed over: ``mesh`` when given, else the ambient mesh
    (``jax.set_mesh`` / ``jax.sharding.use_abstract_mesh``, bound by
    ``jaxrl_llm.parallel.under_mesh``); None when there is neither, or inside a ``shard_map``
    (manual axes: the body's arrays are already per device). None means: place nothing."""
    if jax.sharding.get_abstract_mesh().manual_axes:
        return None
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            return None
    return mesh


def activation_spec(
    logical_axes: tuple[str | None, ...],
    mesh: AnyMesh,
    shape: tuple[int, ...],
    rules: Mapping[str, str | tuple[str, ...] | None] = ACTIVATION_RULES,
) -> PartitionSpec:
    """The ``PartitionSpec`` of an activation of ``shape`` from its logical axes.

    A logical name maps through ``rules``; mesh axes the mesh lacks or of size 1 are left
    out, as is an axis an earlier dimension already uses. A logical ``None``, and a dimension
    its axes do not divide (e.g. a shared prompt's B / G rows), are left to the compiler
    (``PartitionSpec.UNCONSTRAINED``); a rule of ``None`` (``embed``) means whole.

    Raises:
      KeyError: a logical name has no rule.
    """
    if len(logical_axes) != len(shape):
        raise ValueError(f"{len(logical_axes)} logical axes {logical_axes} for shape {shape}")
    used: set[str] = set()
    spec: list = []
    for logical, size in zip(logical_axes, shape):
        if logical is None:
            spec.append(PartitionSpec.UNCONSTRAINED)
            continue
        if logical not in rules:
            raise KeyError(f"activation axis {logical!r} has no rule (known: {sorted(rules)})")
        axes = rules[logical]
        names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        names = tuple(
            n for n in names if n in mesh.axis_names and mesh.shape[n] > 1 and n not in used
        )
        split = 1
        for n in names:
            split *= mesh.shape[n]
        if axes is not None and not names:
            spec.append(None)  # nothing to split it over: whole
        elif size % split:
            spec.append(PartitionSpec.UNCONSTRAINED)
        else:
            used.update(names)
            spec.append(None if not names else names[0] if len(names) == 1 else names)
    return PartitionSpec(*spec)


def constrain(x: jax.Array, logical_axes: tuple[str | None, ...], mesh: AnyMesh) -> jax.Array:
    """``x`` constrained (``jax.lax.with_sharding_constraint``) to :func:`activation_spec`
    over ``mesh``, e.g. ``constrain(h, ("batch", "length", "embed"), mesh)``.

    ``mesh`` is required: resolve it with :func:`layout_mesh` and skip the call when that
    returns None. A mesh of one device places nothing: ``x`` is returned as it is.
    """
    if mesh.size == 1:
        return x
    spec = activation_spec(logical_axes, mesh, tuple(x.shape))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def place(x: jax.Array, logical_axes: tuple[str | None, ...], mesh: AnyMesh | None) -> jax.Array:
    """:func:`constrain` over ``mesh`` already resolved by :func:`layout_mesh`; ``mesh=None``
    (no mesh) returns ``x`` unplaced, by the rule in the module docstring."""
    return x if mesh is None else constrain(x, logical_axes, mesh)
