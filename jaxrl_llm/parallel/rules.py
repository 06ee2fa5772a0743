"""Logical-axis sharding rules: one table, as data, mapping logical axis names to mesh axes.

Every parameter dimension carries a logical name (``jaxrl_llm.models.param_logical_axes``);
the table below says which mesh axis shards it (the approach of EasyLM / MaxText / Flax's
``logical_axis_rules``). A parameter with a logical axis that the table does not mention is an
error — it is never silently replicated.

Non-divisible dimensions (decision): when a dimension's size is not divisible by the size of
its mesh axis (e.g. ``kv_heads=3`` on ``tensor=4``), that dimension alone falls back to
replication, and a :class:`ShardingFallbackWarning` names the parameter, the dimension and the
sizes. The other dimensions keep their sharding. Results stay exact (GSPMD inserts the needed
collectives); only memory and speed change, which is why it is a warning and not an error.
A mesh axis already used by an earlier dimension of the same array is not reused (also
replicated, silently: the rule table may map two dimensions of one array to the same axis).
Of a rule's several mesh axes, those of size 1 are left out of the spec (``embed`` →
``("fsdp", "context")`` is plain ``"fsdp"`` on a mesh without context parallelism).
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.errors import ConfigError

MeshAxes = str | tuple[str, ...] | None

#: The default rule table: logical axis name -> mesh axis (or tuple of axes, or None).
DEFAULT_RULES: Mapping[str, MeshAxes] = types.MappingProxyType(
    {
        # activations / data
        "batch": ("data", "fsdp"),
        # the token (sequence) dimension: split over the context axis (ring attention,
        # jaxrl_llm.models.ring_attention); size 1 = whole rows on each device.
        "length": "context",
        # parameters
        "vocab": "tensor",
        # the parameters' model dimension: FSDP (ZeRO-3) over fsdp and context together, so
        # a context mesh does not hold the whole weights and optimizer state on every device
        # (MaxText shards weights over its context axis too); gathered per layer on use.
        "embed": ("fsdp", "context"),
        "heads": "tensor",
        "kv_heads": "tensor",
        "mlp": "tensor",
        "head_dim": None,
        # mixture of experts: the expert index of expert weights (jaxrl_llm.models.moe);
        # the router's expert logits stay whole (top-k needs every expert's).
        "experts": "expert",
        "router": None,
        "layers": None,
        "norm": None,
        "labels": None,
    }
)


class ShardingFallbackWarning(UserWarning):
    """A dimension was replicated because its size is not divisible by its mesh axis size."""


def _axis_size(mesh: Mesh, axes: MeshAxes) -> int:
    if axes is None:
        return 1
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    size = 1
    for n in names:
        size *= mesh.shape[n]
    return size


def _names(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_spec(
    logical_axes: tuple[str | None, ...],
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
    *,
    shape: tuple[int, ...] | None = None,
    name: str = "array",
) -> PartitionSpec:
    """The ``PartitionSpec`` of one array from its logical axis names.

    Args:
      logical_axes: one logical name per dimension (None = replicated dimension).
      mesh: the mesh (used for axis sizes and to validate mesh axis names).
      rules: logical name -> mesh axis / tuple of axes / None.
      shape: the array shape; when given, non-divisible dimensions fall back to replication
        with a :class:`ShardingFallbackWarning`.
      name: the array's path, used in messages.

    Returns:
      A PartitionSpec with one entry per dimension.

    Raises:
      ConfigError: a logical axis has no rule, or a rule names an axis not in the mesh.
    """
    if shape is not None and len(shape) != len(logical_axes):
        raise ConfigError(
            f"{name}: {len(logical_axes)} logical axes {logical_axes} for an array of shape {shape}"
        )
    used: set[str] = set()
    spec: list[str | tuple[str, ...] | None] = []
    for dim, logical in enumerate(logical_axes):
        if logical is None:
            spec.append(None)
            continue
        if logical not in rules:
            raise ConfigError(
                f"{name}: logical axis {logical!r} has no sharding rule; add it to "
                f"the rules (known: {sorted(rules)})"
            )
        axes = rules[logical]
        names = _names(axes)
        for n in names:
            if n not in mesh.shape:
                raise ConfigError(
                    f"sharding rule {logical!r} -> {axes!r} names mesh axis {n!r}, "
                    f"which the mesh {dict(mesh.shape)} does not have"
                )
        if len(names) > 1:  # axes of size 1 split nothing: leave them out of the spec
            names = tuple(n for n in names if mesh.shape[n] > 1) or names[:1]
        names = tuple(n for n in names if n not in used)
        if not names:
            spec.append(None)
            continue
        size = _axis_size(mesh, names)
        if shape is not None and shape[dim] % size:
            warnings.warn(
                f"{name}: dimension {dim} ({logical}={shape[dim]}) is not divisible by mesh axes "
                f"{names} of size {size}; replicating this dimension",
                ShardingFallbackWarning,
                stacklevel=3,
            )
            spec.append(None)
            continue
        used.update(names)
        spec.append(names[0] if len(names) == 1 else names)
    return PartitionSpec(*spec)


def _is_axes_leaf(x) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def logical_to_sharding(
    axes_tree: Any,
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
    *,
    shapes: Any = None,
) -> Any:
    """Map a tree of logical-axis tuples to a tree of ``NamedSharding``.

    Args:
      axes_tree: a tree whose leaves are tuples of logical names (``param_logical_axes``).
      mesh: the device mesh.
      rules: the rule table (default :data:`DEFAULT_RULES`).
      shapes: optional tree of the same structure with arrays / ShapeDtypeStructs; enables
        the per-dimension divisibility fallback (recommended).

    Returns:
      A tree of ``NamedSharding`` with the structure of ``axes_tree``.

    Raises:
      ConfigError: a logical axis has no rule (never silently replicated).
    """
    paths_axes, treedef = jax.tree_util.tree_flatten_with_path(axes_tree, is_leaf=_is_axes_leaf)
    shape_leaves: list[tuple[int, ...] | None]
    if shapes is None:
        shape_leaves = [None] * len(paths_axes)
    else:
        # jaxlib ships no type stub for PyTreeDef's methods.
        leaves = treedef.flatten_up_to(shapes)  # type: ignore[attr-defined]
        shape_leaves = [tuple(s.shape) for s in leaves]
    out = []
    for (path, axes), shape in zip(paths_axes, shape_leaves):
        spec = logical_to_spec(axes, mesh, rules, shape=shape, name=jax.tree_util.keystr(path))
        out.append(NamedSharding(mesh, spec))
    return jax.tree.unflatten(treedef, out)


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated sharding on ``mesh`` (scalars: step, rng, counters)."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> NamedSharding:
    """Sharding of batch-major arrays ``[B, ...]``: rows split over the ``batch`` rule's axes
    (default ("data", "fsdp")), the remaining dimensions replicated.

    The same ``NamedSharding`` serves arrays of any rank ≥ 1 (a PartitionSpec shorter than the
    rank leaves trailing dimensions replicated). The global batch size must be divisible by
    the product of those axis sizes.
    """
    if "batch" not in rules:
        raise ConfigError(f"the sharding rules have no 'batch' entry (known: {sorted(rules)})")
    axes = _names(rules["batch"])
    return NamedSharding(mesh, PartitionSpec(axes if axes else None))


def token_sharding(mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> NamedSharding:
    """Sharding of token arrays ``[B, T, ...]``: rows over the ``batch`` rule's axes and the
    tokens of each row over the ``length`` rule's axes (default "context": context
    parallelism), trailing dimensions replicated. B and T must be divisible by those sizes.
    """
    for name in ("batch", "length"):
        if name not in rules:
            raise ConfigError(f"the sharding rules have no {name!r} entry (known: {sorted(rules)})")
    rows, length = _names(rules["batch"]), _names(rules["length"])
    length = tuple(n for n in length if n not in rows)
    return NamedSharding(mesh, PartitionSpec(rows if rows else None, length if length else None))


def batch_sharding_tree(
    batch: Any, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> Any:
    """The batch sharding for every leaf of a batch dict; scalar leaves (``[]``, e.g.
    ``loss_denominator``) are replicated.

    When the ``length`` rule's mesh axes have more than one device (context parallelism),
    leaves of rank ≥ 2 whose second dimension they divide take :func:`token_sharding`
    (tokens of a row split over devices); other leaves keep :func:`batch_sharding`.
    """
    rows, rep = batch_sharding(mesh, rules), replicated(mesh)
    split = _axis_size(mesh, _names(rules.get("length"))) if "length" in rules else 1
    tokens = token_sharding(mesh, rules) if split > 1 else rows

    def leaf(x):
        nd = jax.numpy.ndim(x)
        if nd == 0:
            return rep
        if nd >= 2 and split > 1 and jax.numpy.shape(x)[1] % split == 0:
            return tokens
        return rows

    return jax.tree.map(leaf, batch)
