"""Host-local rows: how a multi-process step's batches meet across hosts.

Every process runs the same loop. Each samples and scores its own share of the step's prompts on
its own devices (:func:`process_share`; its part of the sampler's copy:
``parallel/sampler_copy.py``) and keeps those rows. They enter the jitted programs as this
process's part of global arrays split by rows over the whole mesh (:func:`rows_to_global`,
``jax.make_array_from_process_local_data``; :func:`on_processes` with ``local_rows``); a
minibatch of the whole step is gathered by a program (:func:`take_rows`), a batch-level
normalisation runs as a program on the global rows (:func:`over_processes`), and what crosses
hosts outside the programs is numbers (:func:`gather_numbers`: metrics, per-row rewards, widths
to agree on). Offline runs read the whole batch on every host (:func:`to_global`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel.rules import DEFAULT_RULES, MeshAxes, batch_sharding, replicated


def host_local_rows(
    mesh: Mesh, global_batch_size: int, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> slice:
    """The contiguous slice of global batch rows this process must load.

    Args:
      mesh: the global mesh.
      global_batch_size: B, divisible by the batch axes' size.

    Returns:
      ``slice(start, stop)`` of rows held by this process's devices under
      :func:`~jaxrl_llm.parallel.batch_sharding`.

    Raises:
      ConfigError: B is not divisible, or this process's rows are not contiguous (a mesh
        whose batch axes interleave hosts).
    """
    sharding = batch_sharding(mesh, rules)
    shards = int(np.prod([mesh.shape[a] for a in sharding.spec[0]])) if sharding.spec[0] else 1
    if global_batch_size % shards:
        raise ConfigError(
            f"global batch size {global_batch_size} is not divisible by the "
            f"{shards} batch shards of mesh {dict(mesh.shape)}"
        )
    index_map = sharding.addressable_devices_indices_map((global_batch_size,))
    rows = sorted(
        {
            (idx[0].start or 0, idx[0].stop if idx[0].stop is not None else global_batch_size)
            for idx in index_map.values()
            if idx is not None
        }
    )
    start, stop = rows[0][0], rows[-1][1]
    covered = sum(b - a for a, b in rows)
    if covered != stop - start:
        raise ConfigError(
            f"this process's batch rows {rows} are not contiguous on mesh "
            f"{dict(mesh.shape)}; put hosts on the outermost batch axis"
        )
    return slice(start, stop)


def host_local_batch_to_global(
    batch: Mapping[str, Any], mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> dict[str, jax.Array]:
    """Assemble per-process rows into global, batch-sharded ``jax.Array`` s.

    Each process passes its own rows (``batch[k]`` of shape ``[B_local, ...]``, the rows
    :func:`host_local_rows` names); the result has ``[B_local · num_processes, ...]`` global
    shape. Scalars (``[]``, e.g. ``loss_denominator``) must be equal on every process and
    come back replicated. In a single process this is ``jax.device_put`` with the batch
    sharding.
    """
    rows, rep = batch_sharding(mesh, rules), replicated(mesh)
    return {k: _from_local(v, rows, rep) for k, v in batch.items()}


def process_share(n: int, index: int | None = None, count: int | None = None) -> slice:
    """This process's contiguous share of ``n`` items (``np.array_split``'s sizes: the first
    ``n mod count`` shares one larger), in process order, so that the shares concatenated in
    process order are the ``n`` items."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (index < extra))


def to_global(tree: Any, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> Any:
    """Host arrays that every process holds whole (an offline batch every host reads) as
    global arrays: rows (rank ≥ 1) split over the batch axes, scalars replicated. Device
    arrays pass."""
    rows, rep = batch_sharding(mesh, rules), replicated(mesh)

    def put(x):
        if isinstance(x, jax.Array) or not isinstance(x, np.ndarray | np.generic):
            return x
        x = np.asarray(x)
        sharding = rep if x.ndim == 0 else rows
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, tree)


def _is_local(x: Any) -> bool:
    """A leaf that holds this process's rows: a host array, or a device array on this
    process's devices only (a global array spanning processes is not one)."""
    if isinstance(x, jax.Array):
        return x.is_fully_addressable
    return isinstance(x, np.ndarray | np.generic)


def rows_to_global(
    tree: Any, mesh: Mesh | None = None, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> Any:
    """This process's rows as its part of global arrays (host-local batches).

    Every process passes leaves of the same shape ``[n, ...]`` (its n rows); each comes back
    as one ``[n · processes, ...]`` array split by rows, process p's rows at
    ``[p·n, (p+1)·n)``, built with ``jax.make_array_from_process_local_data`` (no row leaves
    its host). ``mesh``: split over its batch axes (the programs' layout: every process's
    devices must hold that process's contiguous block, :func:`check_host_blocks`); None:
    over :func:`process_mesh`, one device per process. Scalars must be equal on every
    process and come back replicated; global arrays and non-array leaves pass. One process:
    the tree unchanged.
    """
    if jax.process_count() == 1:
        return tree
    rows = batch_sharding(mesh, rules) if mesh is not None else _process_rows()
    rep = replicated(mesh if mesh is not None else process_mesh())
    return jax.tree.map(lambda x: _from_local(x, rows, rep) if _is_local(x) else x, tree)


def _from_local(x: Any, rows: NamedSharding, rep: NamedSharding) -> jax.Array:
    """One leaf of this process's rows as its part of a global array (a scalar: replicated)."""
    x = np.asarray(x)
    if x.ndim == 0:
        return jax.make_array_from_process_local_data(rep, x, ())
    shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
    return jax.make_array_from_process_local_data(rows, x, shape)


def rows_to_local(tree: Any) -> Any:
    """Global arrays split by rows over processes back to this process's rows (numpy): the
    rows its devices hold, in order (a replica's copy once). Replicated and fully
    addressable leaves come back whole as numpy; non-array leaves pass."""

    def get(x):
        if not isinstance(x, jax.Array):
            return x
        if x.is_fully_addressable:
            return np.asarray(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        blocks: dict[int, np.ndarray] = {}
        for shard in x.addressable_shards:
            start = (shard.index[0].start or 0) if shard.index else 0
            blocks.setdefault(start, np.asarray(shard.data))
        return np.concatenate([blocks[k] for k in sorted(blocks)], 0)

    return jax.tree.map(get, tree)


@functools.cache
def process_mesh() -> Mesh:
    """A 1-D mesh (axis ``processes``) of one device per process, in process order: where
    host-local rows meet for a program that needs the whole batch (a batch-level
    normalisation) without any layout of the learner's."""
    first: dict[int, Any] = {}
    for d in sorted(jax.devices(), key=lambda d: d.id):
        first.setdefault(d.process_index, d)
    return Mesh(np.array([first[p] for p in sorted(first)]), ("processes",))


def _process_rows() -> NamedSharding:
    from jax.sharding import PartitionSpec

    return NamedSharding(process_mesh(), PartitionSpec("processes"))


def check_host_blocks(mesh: Mesh, rows: int, rules: Mapping[str, MeshAxes] = DEFAULT_RULES) -> None:
    """Refuse, in one line, a mesh on which process p's devices do not hold the p-th block of
    ``rows`` global batch rows (hosts not outermost on the batch axes): host-local rows would
    land in another process's place."""
    if jax.process_count() == 1:
        return
    held = host_local_rows(mesh, rows, rules)
    block = rows // jax.process_count()
    want = slice(jax.process_index() * block, (jax.process_index() + 1) * block)
    if held != want:
        raise ConfigError(
            f"on mesh {dict(mesh.shape)} process {jax.process_index()}'s devices hold batch "
            f"rows {held.start}..{held.stop - 1}, not its own {want.start}..{want.stop - 1}: "
            f"put hosts on the outermost batch axis (mesh.data)"
        )


#: Bytes this process has sent to the others through :func:`gather_numbers`, and how many
#: such collectives it joined (the step's ``hosts/exchanged_bytes`` and ``hosts/collectives``:
#: numbers, never rows).
EXCHANGED = [0, 0]


def gather_numbers(values: Any) -> np.ndarray:
    """``[processes, ...]``: every process's ``values`` (a small float or int array of the same
    shape everywhere: metrics, counts) on every process, in process order, by one device
    collective (``jax.experimental.multihost_utils.process_allgather``). The only thing a
    host-local step sends between hosts outside its programs: numbers, not rows. Every
    process must call it at the same point (the main thread)."""
    x = np.ascontiguousarray(values)
    if jax.process_count() == 1:
        return x[None]
    EXCHANGED[0] += x.nbytes
    EXCHANGED[1] += 1
    from jax.experimental import multihost_utils

    # as bytes: a float64 or int64 would pass through JAX as 32 bits (x64 off)
    raw = np.frombuffer(x.tobytes(), np.uint8)
    out = np.asarray(multihost_utils.process_allgather(raw, tiled=False))
    return np.ascontiguousarray(out).view(x.dtype).reshape((out.shape[0], *x.shape))


def gather_packed(parts: Sequence[Any]) -> list[np.ndarray]:
    """Several :func:`gather_numbers` in one: each of ``parts`` (small arrays, each of the
    same shape and dtype on every process) comes back as ``[processes, *shape]`` of its dtype,
    in order, by one collective (their bytes side by side). Values known at the same point of
    a step travel together this way, so that a step's exchanges are as few as its data
    dependencies allow."""
    arrays = [np.asarray(p) for p in parts]  # a scalar stays 0-d (ascontiguousarray: 1-d)
    if jax.process_count() == 1:
        return [x[None] for x in arrays]
    raw = np.concatenate(
        [np.frombuffer(x.tobytes(), np.uint8) for x in arrays] or [np.zeros(0, np.uint8)]
    )
    table = gather_numbers(raw)
    out, start = [], 0
    for x in arrays:
        chunk = np.ascontiguousarray(table[:, start : start + x.nbytes])
        out.append(chunk.view(x.dtype).reshape((table.shape[0], *x.shape)))
        start += x.nbytes
    return out


def gather_strings(text: str) -> list[str]:
    """Every process's ``text`` (short: metric names), in process order, on every process:
    two :func:`gather_numbers` (the lengths, then the bytes padded to the longest)."""
    data = text.encode()
    if jax.process_count() == 1:
        return [text]
    width = int(gather_numbers(np.int64(len(data))).max())
    raw = np.zeros(width, np.uint8)
    raw[: len(data)] = np.frombuffer(data, np.uint8)
    return [bytes(row).rstrip(b"\0").decode() for row in gather_numbers(raw)]


def to_host(tree: Any) -> Any:
    """Global arrays split over processes gathered whole onto every process (numpy);
    replicated and single-process leaves pass unchanged."""
    from jax.experimental import multihost_utils

    def get(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return x

    return jax.tree.map(get, tree)


def on_processes(fn: Any, mesh: Mesh, *, gather: bool, local_rows: bool = False) -> Any:
    """``fn`` (a jitted program) callable with host batches on a mesh spanning processes.

    ``local_rows=False``: every process passes the whole batch (:func:`to_global`); with
    ``gather`` the outputs come back whole on every process (:func:`to_host`).
    ``local_rows=True`` (host-local batches, the online loop): every process passes its own
    rows (:func:`rows_to_global`); with ``gather`` the per-row outputs come back as this
    process's rows (:func:`rows_to_local`). Without ``gather`` the outputs stay global
    arrays. ``fn`` itself on one process."""
    if jax.process_count() == 1:
        return fn
    enter = (
        functools.partial(rows_to_global, mesh=mesh)
        if local_rows
        else functools.partial(to_global, mesh=mesh)
    )
    leave = rows_to_local if local_rows else to_host

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        out = fn(*enter(args), **enter(kwargs))
        return leave(out) if gather else out

    return wrapped


def over_processes(fn: Any) -> Any:
    """``fn`` (arrays → arrays, jnp) applied to the whole batch that host-local rows make:
    each process passes its own rows (``[n, ...]``; None and scalars pass), ``fn`` runs once
    as a program on the global arrays (:func:`rows_to_global` over :func:`process_mesh`:
    batch-level means and variances are the whole batch's, by the program's collectives),
    and each process gets back its rows of the result (a scalar whole). ``fn`` itself on one
    process. Every process must call it at the same point."""
    if jax.process_count() == 1:
        return fn
    program = jax.jit(fn)

    @functools.wraps(fn)
    def wrapped(*args):
        return rows_to_local(program(*rows_to_global(args)))

    return wrapped


def take_rows(
    tree: Any, index: np.ndarray, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> Any:
    """Rows ``index`` (global positions, the same on every process) of global arrays split
    by rows (host-local batches), split by rows over ``mesh``'s batch axes again: a program
    whose collectives bring each device its rows from whichever host holds them (a
    minibatch drawn from the whole step's rows, as one process would draw it). Scalars
    pass."""
    idx = np.asarray(index, np.int32)
    rep = replicated(mesh)
    where = jax.make_array_from_callback(idx.shape, rep, lambda i: idx[i])
    return _take(batch_sharding(mesh, rules))(tree, where)


@functools.cache
def _take(rows: NamedSharding) -> Any:
    def take(tree, where):
        return jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x[where], rows) if x.ndim else x, tree
        )

    return jax.jit(take)


def agree_width(batch: dict[str, Any], *, pad_id: int = 0) -> dict[str, Any]:
    """A host-local batch (``input_ids [n, T]`` and leaves of the same T) left-padded to the
    widest T of every process's, so that the rows meet in one global array: ``input_ids``
    with ``pad_id``, the rest (masks) with 0 (masked: no result changes). Unchanged on one
    process."""
    if jax.process_count() == 1:
        return batch
    t = int(np.shape(batch["input_ids"])[1])
    width = int(gather_numbers(np.int64(t)).max())
    if width == t:
        return batch

    def pad(key: str, x: Any) -> Any:
        x = np.asarray(x)
        if x.ndim < 2 or x.shape[1] != t:
            return x
        fill = pad_id if key == "input_ids" else 0
        return np.pad(x, ((0, 0), (width - t, 0)) + ((0, 0),) * (x.ndim - 2), constant_values=fill)

    return {k: pad(k, v) for k, v in batch.items()}
