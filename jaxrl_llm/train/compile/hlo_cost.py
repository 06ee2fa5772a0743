"""Per-device work of a compiled program, read from its HLO text with loop trip counts.

XLA's ``compiled.cost_analysis()`` counts the body of a ``while`` loop once, so the scan over
a model's layers, the micro-batch loop and the decode loop count as one iteration each: a
train step's FLOPs come out about 1/L of the step. :func:`hlo_cost` reads the compiled
(partitioned, so per-device) HLO text of ``compiled.as_text()`` instead and weights every
computation by how many times it runs:

* **Multipliers.** The entry computation runs once; a ``while`` body runs its trip count
  times per run of the computation that holds the loop; a fusion, an async wrapper, a
  ``call``, a branch of a ``conditional`` (every branch, an upper bound: one of them runs) and
  a reduction's ``to_apply`` run as often as their caller. A computation called from several
  places runs the sum.
* **Trip counts.** From XLA's ``backend_config`` ``known_trip_count`` where the compiler
  wrote one (XLA:CPU does); else from the loop's condition, ``i < c`` (``<=``, ``>``,
  ``>=``, ``!=`` alike) with ``c`` a constant, ``i``'s start a constant of the loop's initial
  tuple (0 when it is not one) and its step the constant the body adds (1 when it is not
  one) — what the TPU compiler leaves of a ``lax.scan`` / ``fori_loop``. A loop whose
  condition is data-dependent (the sampler's ``lax.while_loop``: stop when every row is
  done) has no count in the HLO; it is given ``unknown_trips`` (the caller's bound, e.g.
  ``max_new_tokens`` for the decode loop) and counted in :attr:`HloCost.unknown_loops`;
  so is the blockwise attention's loop over key blocks, whose bound is the (causal) query
  block's index, carried by the outer loop: part of attention's T² term goes uncounted.
* **FLOPs**: matrix products only: ``dot`` / ``ragged-dot`` 2 · (output elements) ·
  (product of the left operand's contracting dimensions); ``convolution`` (the TPU compiler
  writes many matmuls as convolutions, batch dimensions as padded, dilated windows) 2 ·
  (output batch · output features) · (kernel input features) · Π over spatial dimensions
  of the (output, kernel) position pairs that land on a real input element, as XLA counts
  it. Elementwise ops, reductions and transcendentals are left out (XLA's own ``flops``
  counts them, so on a matmul-dominated program it is a few percent above this count of
  one iteration per loop), and so are custom calls (Pallas / Mosaic kernels), whose cost
  the HLO does not show.
* **HBM bytes**: every instruction of a computation that is not inside a fusion (the
  entry, loop bodies, branches), except ops that pass buffers on (parameters, tuples,
  bitcasts, loops, the ``-done`` halves of async ops) and collectives (counted apart): the
  bytes of its operands plus its results. A fusion operand read only through slices (the
  scan's ``dynamic-slice`` of one layer's weights out of the stacked ``[L, ...]`` array, an
  embedding ``gather``), also through bitcasts, converts and nested fusions, counts the
  slices' share of it; an in-place ``dynamic-update-slice`` (a KV
  cache write, a scan's stacked output) counts its update twice (read, write), not the
  whole buffer. Arrays the TPU compiler placed in on-chip memory (layout ``S(1)``) are
  left out; the asynchronous copies that move them (``copy-start``) count their HBM side:
  a prefetch reads HBM, an eviction writes it. What this leaves: a fusion that reads an operand twice counts it once, cache
  effects and the compiler's own rematerialisation are invisible, and the count is of
  traffic, not of time (no overlap). It is an estimate, checked against XLA's ``bytes
  accessed`` on small programs only (within 10% on XLA:CPU with each loop counted once).
* **Copy bytes**: the part of the HBM bytes spent by instructions that only move data
  (:func:`is_copy`), reported apart so that a copy is not counted as weight or KV traffic.
* **Collective bytes**: what one device sends in each collective under a ring model over
  its group of n devices: all-gather (n − 1) · operand, reduce-scatter and all-to-all
  (n − 1)/n · operand, all-reduce 2 (n − 1)/n · operand, collective-permute the operand. The
  group size is read from ``replica_groups`` (explicit lists, iota ``[a,b]<=[...]`` and
  ``mesh[...] {axes}`` forms); without one it is ``num_devices``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable

import numpy as np

from jaxrl_llm.train.compile.hlo_text import (
    Array,
    Computation,
    Instr,
    callees,
    multipliers,
    parse_computations,
)

_DIMS = {k: re.compile(k + r"=\{([0-9,]*)\}") for k in ("lhs_contracting_dims",)}
_DIM_LABELS = re.compile(r"dim_labels=([\w?]+)_([\w?]+)->([\w?]+)")

#: Collective ops, by the kind their bytes are reported under (async ``-start`` halves too).
COLLECTIVES = {
    "all-gather": "all-gather",
    "all-gather-start": "all-gather",
    "all-reduce": "all-reduce",
    "all-reduce-start": "all-reduce",
    "reduce-scatter": "reduce-scatter",
    "all-to-all": "all-to-all",
    "ragged-all-to-all": "all-to-all",
    "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute",
    "collective-broadcast": "collective-permute",
}
# ops whose results are other instructions' buffers, or that move nothing themselves
_NO_TRAFFIC = frozenset(
    (
        "parameter",
        "constant",
        "bitcast",
        "get-tuple-element",
        "tuple",
        "while",
        "call",
        "conditional",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "copy-done",
        "add-dependency",
        "domain",
        "iota",
    )
)
_SLICING = frozenset(("dynamic-slice", "slice", "gather"))
# ops that only move or re-lay out data: a top-level one, or a fusion of nothing else, is a
# copy (a layer's K/V slice copied out of the stacked cache, a relayout between programs)
_MOVES = frozenset(("copy", "transpose", "dynamic-slice", "slice", "concatenate"))
_MOVE_PASSIVE = frozenset(("parameter", "constant", "bitcast", "reshape", "tuple"))


@dataclasses.dataclass(frozen=True)
class HloCost:
    """Per-device work of one call of a compiled program (module docstring for the method).

    Attributes:
      flops: matmul FLOPs, loop trip counts applied.
      flops_once: the same with every loop body counted once (what XLA's cost analysis
        does; comparable to its ``flops`` minus elementwise work).
      hbm_bytes: bytes read and written in HBM, trip counts applied.
      hbm_bytes_once: the same with every loop body counted once (comparable to XLA's
        ``bytes accessed``).
      collective_bytes: bytes one device sends in collectives, trip counts applied.
      collectives: ``collective_bytes`` by kind (all-gather, all-reduce, ...).
      trip_counts: the trip counts of the program's loops as found (outermost first is not
        guaranteed), unknown ones as the ``unknown_trips`` they were given.
      unknown_loops: loops whose trip count the HLO does not say.
      copy_bytes: the part of ``hbm_bytes`` that only moves data (:func:`is_copy`: a
        ``copy``, ``transpose``, slice or concatenation, or a fusion of nothing else), trip
        counts applied: bytes a program spends re-reading and re-writing what it already
        holds, such as a layer's K/V slice copied out of a stacked cache at every step.
      collective_calls: collectives one call runs, trip counts applied.
      collective_hops: the link hops those collectives wait through one after another
        (:func:`collective_hops`), trip counts applied: what a per-hop latency multiplies.
    """

    flops: float
    flops_once: float
    hbm_bytes: float
    hbm_bytes_once: float
    collective_bytes: float
    collectives: dict[str, float]
    trip_counts: tuple[int, ...]
    unknown_loops: int
    copy_bytes: float = 0.0
    collective_calls: float = 0.0
    collective_hops: float = 0.0


def is_copy(instr: Instr, comps: dict[str, Computation]) -> bool:
    """A top-level instruction that only moves data: a ``copy`` / ``transpose`` / slice /
    concatenation, or a fusion whose computation (nested fusions too) holds only those and
    bitcasts, reshapes, parameters and constants; or a ``copy-start`` that evicts an
    on-chip buffer back to HBM (a prefetch into on-chip memory is the read a consumer needs,
    not a copy). An in-place ``dynamic-update-slice`` (a cache write) is not one: it writes
    new values."""
    if instr.op in _MOVES:
        return True
    if instr.op == "copy-start":  # an eviction from on-chip memory back to HBM
        return bool(instr.result) and not instr.result[0].on_chip
    if instr.op != "fusion":
        return False
    fused = comps.get(dict(callees(instr)).get("calls", ""))
    if fused is None:
        return False
    moved = False
    for i in fused.instrs:
        if i.op in _MOVES or i.op == "fusion" and is_copy(i, comps):
            moved = True
        elif i.op not in _MOVE_PASSIVE:
            return False
    return moved


def _dot_flops(instr: Instr, comp: Computation, operand) -> float:
    out = sum(a.elements for a in instr.result)
    if instr.op in ("dot", "ragged-dot"):
        lhs = operand(comp, instr.operands[0]) if instr.operands else ()
        m = _DIMS["lhs_contracting_dims"].search(instr.attrs)
        if not lhs or m is None:
            return 0.0
        dims = [int(d) for d in m.group(1).split(",") if d]
        return 2.0 * out * math.prod(lhs[0].dims[d] for d in dims)
    if instr.op == "convolution" and len(instr.operands) > 1:
        lhs, kernel = operand(comp, instr.operands[0]), operand(comp, instr.operands[1])
        m = _DIM_LABELS.search(instr.attrs)
        if not lhs or not kernel or not instr.result or m is None:
            return 0.0
        return _conv_flops(lhs[0].dims, kernel[0].dims, instr.result[0].dims, m, instr.attrs)
    return 0.0


def _window(attrs: str, key: str, n: int, default: int) -> list[tuple[int, ...]]:
    m = re.search(r"\b" + key + r"=([-0-9_x]+)", attrs)
    if m is None:
        return [(default, default)] * n
    return [tuple(int(v) for v in part.split("_")) for part in m.group(1).split("x")]


def _conv_flops(lhs, kernel, out, labels: re.Match, attrs: str) -> float:
    """2 · (output batch · output features) · (kernel input features) · Π over spatial
    dimensions of the (output position, kernel position) pairs that land on a real input
    element (not padding, not a hole of ``lhs_dilate``): how XLA counts a convolution, which
    the TPU compiler also uses for batched matmuls (a batch dimension as a padded window)."""
    lhs_l, rhs_l, out_l = labels.group(1), labels.group(2), labels.group(3)
    spatial = sorted(c for c in out_l if c.isdigit())
    n = len(spatial)
    pads = _window(attrs, "pad", n, 0)
    strides = [p[0] for p in _window(attrs, "stride", n, 1)]
    lhs_dil = [p[0] for p in _window(attrs, "lhs_dilate", n, 1)]
    rhs_dil = [p[0] for p in _window(attrs, "rhs_dilate", n, 1)]
    pairs = 1.0
    for j, c in enumerate(spatial):
        size_in, size_k, size_out = lhs[lhs_l.index(c)], kernel[rhs_l.index(c)], out[out_l.index(c)]
        span = (size_in - 1) * lhs_dil[j] + 1  # the dilated input
        o = np.arange(size_out) * strides[j] - pads[j][0]
        valid = 0
        for k in range(size_k):
            pos = o + k * rhs_dil[j]
            valid += int(np.count_nonzero((pos >= 0) & (pos < span) & (pos % lhs_dil[j] == 0)))
        pairs *= valid
    per_pair = out[out_l.index("b")] * out[out_l.index("f")] * kernel[rhs_l.index("i")]
    return 2.0 * per_pair * pairs


def _group_size(attrs: str, num_devices: int) -> int:
    m = re.search(r"replica_groups=\{\{([0-9,]*)\}", attrs)
    if m:
        return max(len([x for x in m.group(1).split(",") if x]), 1)
    m = re.search(r"replica_groups=\[([0-9,]+)\]<=", attrs)
    if m:
        return int(m.group(1).split(",")[-1])
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if m:
        sizes = dict(re.findall(r"'?([\w]+)'?=(\d+)", m.group(1)))
        axes = re.findall(r"'?([\w]+)'?", m.group(2))
        return int(np.prod([int(sizes.get(a, 1)) for a in axes])) if axes else 1
    return num_devices


def _collective_bytes(kind: str, operand_bytes: float, n: int) -> float:
    if n <= 1 and kind != "collective-permute":
        return 0.0
    if kind == "all-gather":
        return (n - 1) * operand_bytes
    if kind == "all-reduce":
        return 2 * (n - 1) / n * operand_bytes
    if kind in ("reduce-scatter", "all-to-all"):
        return (n - 1) / n * operand_bytes
    return operand_bytes  # collective-permute: each device sends its buffer once


def collective_hops(kind: str, n: int) -> int:
    """The sequential link hops of one collective over a group of ``n`` devices under the
    ring model of the bytes (module docstring): a ring all-gather, reduce-scatter or
    all-to-all passes n − 1 steps, an all-reduce (reduce-scatter then all-gather) 2 (n − 1),
    a collective-permute one; 0 over one device."""
    if kind == "collective-permute":
        return 1
    if n <= 1:
        return 0
    return 2 * (n - 1) if kind == "all-reduce" else n - 1


def _hbm(arrays: Iterable[Array]) -> float:
    return sum(a.nbytes for a in arrays if not a.on_chip)


_TRANSPARENT = frozenset(("bitcast", "reshape", "convert", "copy"))


def _users(comp: Computation) -> dict[str, list[Instr]]:
    users: dict[str, list[Instr]] = {}
    for i in comp.instrs:
        for o in set(i.operands):
            users.setdefault(o, []).append(i)
    return users


def _read_fraction(
    comp: Computation, name: str, comps: dict[str, Computation], depth: int = 0
) -> float:
    """The fraction of the array ``name`` that ``comp`` reads: the slices its slicing users
    take (through bitcasts, converts and nested fusions), 0 for the buffer of an in-place
    ``dynamic-update-slice``, else 1."""
    instr = comp.by_name.get(name)
    users = _users(comp).get(name, [])
    if instr is None or not users or depth > 8 or instr.root:
        return 1.0
    whole = max(sum(a.elements for a in instr.result), 1)
    frac = 0.0
    for u in users:
        first = u.operands[:1] == (name,) and name not in u.operands[1:]
        if u.op in _SLICING and first:
            frac += sum(a.elements for a in u.result) / whole
        elif u.op == "dynamic-update-slice" and first:
            continue
        elif u.op in _TRANSPARENT:
            frac += _read_fraction(comp, u.name, comps, depth + 1)
        elif u.op == "fusion":
            nested = comps.get(dict(callees(u)).get("calls", ""))
            params = _parameters(nested) if nested is not None else {}
            for j, o in enumerate(u.operands):
                if o == name:
                    p = params.get(j)
                    frac += 1.0 if p is None else _read_fraction(nested, p, comps, depth + 1)  # type: ignore[arg-type]
        else:
            return 1.0
    return min(frac, 1.0)


def _parameters(comp: Computation) -> dict[int, str]:
    return {int(i.args.strip() or 0): i.name for i in comp.instrs if i.op == "parameter"}


def _root_update(comp: Computation | None, instr: Instr, operand) -> tuple[Array, ...] | None:
    """The update of an in-place ``dynamic-update-slice`` that ``instr`` (or the root of
    its fused computation ``comp``) is, else None."""
    inner = comp.root if comp is not None else instr
    while comp is not None and inner is not None and inner.op in _TRANSPARENT:
        inner = comp.by_name.get(inner.operands[0]) if inner.operands else None
    if inner is None or inner.op != "dynamic-update-slice" or len(inner.operands) < 2:
        return None
    return operand(comp if comp is not None else None, inner.operands[1])


def _async_copy_traffic(instr: Instr, comp: Computation, operand) -> float:
    """HBM bytes of a ``copy-start`` (result ``(destination, source, context)``): the
    source read where it lies in HBM, the destination written where it does (a prefetch
    into on-chip memory reads HBM; an eviction back writes it)."""
    source = _hbm(operand(comp, instr.operands[0])) if instr.operands else 0.0
    return source + (_hbm(instr.result[:1]) if instr.result else 0.0)


def _fusion_traffic(
    instr: Instr,
    comp: Computation,
    fused: Computation | None,
    operand,
    comps: dict[str, Computation],
) -> float:
    """HBM bytes of one top-level instruction (module docstring)."""
    if instr.op == "copy-start":
        return _async_copy_traffic(instr, comp, operand)
    update = _root_update(fused, instr, lambda c, n: operand(c or comp, n))
    total = _hbm(instr.result) if update is None else 2 * _hbm(update)
    params = _parameters(fused) if fused is not None else {}
    for k, name in enumerate(instr.operands):
        arrays = operand(comp, name)
        if fused is None:
            if instr.op in _SLICING and k == 0:
                total += _hbm(instr.result)
            elif not (instr.op == "dynamic-update-slice" and k == 0):
                total += _hbm(arrays)
            continue
        param = params.get(k)
        frac = 1.0 if param is None else _read_fraction(fused, param, comps)
        total += frac * _hbm(arrays)
    return total


def hlo_cost(hlo_text: str, *, num_devices: int = 1, unknown_trips: int = 1) -> HloCost:
    """Per-device FLOPs, HBM bytes and collective bytes of one call of a compiled program,
    loop trip counts applied (module docstring for the method and its limits).

    Args:
      hlo_text: ``compiled.as_text()`` of a compiled (SPMD-partitioned) program.
      num_devices: the program's devices (a collective without replica groups spans them).
      unknown_trips: the trip count given to a loop whose count the HLO does not say (the
        decode loop's ``max_new_tokens``: an upper bound, every row running to the end).

    Returns:
      An :class:`HloCost`.
    """
    comps, entry = parse_computations(hlo_text)
    if entry is None:
        return HloCost(0.0, 0.0, 0.0, 0.0, 0.0, {}, (), 0)
    mult, inner, trips, unknown = multipliers(comps, entry, unknown_trips)
    mult_once = multipliers(comps, entry, unknown_trips, once=True)[0]

    def operand(comp: Computation, name: str) -> tuple[Array, ...]:
        instr = comp.by_name.get(name)
        return instr.result if instr is not None else ()

    flops = flops_once = hbm = hbm_once = copies = calls = hops = 0.0
    coll: dict[str, float] = {}
    for comp in comps.values():
        runs = mult.get(comp.name, 0.0)
        for instr in comp.instrs:
            f = _dot_flops(instr, comp, operand)
            flops += f * runs
            flops_once += f * mult_once.get(comp.name, 0.0)
            kind = COLLECTIVES.get(instr.op)
            if kind is not None:
                n = _group_size(instr.attrs, num_devices)
                sent = _collective_bytes(
                    kind, sum(sum(a.nbytes for a in operand(comp, o)) for o in instr.operands), n
                )
                coll[kind] = coll.get(kind, 0.0) + sent * runs
                calls += runs
                hops += collective_hops(kind, n) * runs
                continue
            if comp.name in inner or instr.op in _NO_TRAFFIC or instr.op.endswith("-done"):
                continue
            fused = None
            if instr.op == "fusion":
                fused = comps.get(dict(callees(instr)).get("calls", ""))
            traffic = _fusion_traffic(instr, comp, fused, operand, comps)
            hbm += traffic * runs
            hbm_once += traffic * mult_once.get(comp.name, 0.0)
            if is_copy(instr, comps):
                copies += traffic * runs
    return HloCost(
        flops=flops,
        flops_once=flops_once,
        hbm_bytes=hbm,
        hbm_bytes_once=hbm_once,
        collective_bytes=sum(coll.values()),
        collectives=coll,
        trip_counts=tuple(trips),
        unknown_loops=unknown,
        copy_bytes=copies,
        collective_calls=calls,
        collective_hops=hops,
    )
