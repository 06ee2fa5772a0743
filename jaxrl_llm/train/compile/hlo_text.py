"""Compiled HLO text read into its computations, and how many times each runs per call.

The parser behind :func:`~jaxrl_llm.train.compile.hlo_cost.hlo_cost` (whose module docstring
gives the method): :func:`parse_computations` splits ``compiled.as_text()`` into computations
of instructions; :func:`multipliers` weights each computation by the runs of its callers and
the trip counts of the ``while`` loops that call it (XLA's ``known_trip_count``, else the
loop's condition ``i < c`` with constant start and step; a data-dependent loop gets the
caller's ``unknown_trips``).
"""

from __future__ import annotations

import dataclasses
import math
import re

# HLO element type -> bytes per element (pred and token as one byte; tokens hold nothing)
_ITEMSIZE = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
    "c64": 8,
    "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,<=]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLEE = re.compile(
    r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_CALLEE_LIST = re.compile(r"\b(branch_computations|called_computations)=\{([^}]*)\}")
_NAME = re.compile(r"%([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_DIRECTION = re.compile(r"direction=(\w+)")
_INDEX = re.compile(r"\bindex=(\d+)")


@dataclasses.dataclass(frozen=True)
class Array:
    """One array of an instruction's result type: element type, dimensions, memory space."""

    dtype: str
    dims: tuple[int, ...]
    on_chip: bool  # memory space S(1): the TPU's on-chip memory, not HBM

    @property
    def elements(self) -> int:
        """The number of elements."""
        return math.prod(self.dims)

    @property
    def nbytes(self) -> float:
        """Bytes of the array (sub-byte types as fractions)."""
        return self.elements * _ITEMSIZE.get(self.dtype, 0)


@dataclasses.dataclass(frozen=True)
class Instr:
    """One HLO instruction: its result arrays, op, operand names and attribute text."""

    name: str
    result: tuple[Array, ...]
    op: str
    operands: tuple[str, ...]
    args: str  # the text inside the op's parentheses (constants' literals)
    attrs: str
    root: bool


@dataclasses.dataclass
class Computation:
    """One HLO computation: its instructions in order, and by name."""

    name: str
    instrs: list[Instr]
    by_name: dict[str, Instr]

    @property
    def root(self) -> Instr | None:
        """The ``ROOT`` instruction (else the last one; None when empty)."""
        return next((i for i in self.instrs if i.root), self.instrs[-1] if self.instrs else None)


def _arrays(type_text: str) -> tuple[Array, ...]:
    out = []
    for dtype, dims, layout in _ARRAY.findall(type_text):
        if dtype not in _ITEMSIZE:
            continue
        shape = tuple(int(d.lstrip("<=")) for d in dims.split(",") if d)
        out.append(Array(dtype, shape, "S(1)" in (layout or "")))
    return tuple(out)


def _split_type(rhs: str) -> tuple[str, str]:
    """``"(f32[2], s32[]) while(%t), ..."`` -> (type text, the rest)."""
    rhs = rhs.lstrip()
    if rhs.startswith("("):
        depth = 0
        for i, ch in enumerate(rhs):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                return rhs[: i + 1], rhs[i + 1 :].lstrip()
    kind, _, rest = rhs.partition(" ")
    return kind, rest.lstrip()


def _parse_instr(line: str) -> Instr | None:
    m = _INSTR.match(line)
    if m is None:
        return None
    type_text, rest = _split_type(m.group(3))
    op, paren, tail = rest.partition("(")
    if not paren:
        return None
    depth, end = 1, len(tail)
    for i, ch in enumerate(tail):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            end = i
            break
    args = tail[:end]
    return Instr(
        name=m.group(2),
        result=_arrays(type_text),
        op=op.strip(),
        operands=tuple(_NAME.findall(args)),
        args=args,
        attrs=tail[end + 1 :],
        root=m.group(1) is not None,
    )


def parse_computations(hlo_text: str) -> tuple[dict[str, Computation], str | None]:
    """The computations of an HLO module's text by name, and the entry's name."""
    comps: dict[str, Computation] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header and " = " not in line.split("(", 1)[0]:
            current = Computation(header.group(2), [], {})
            comps[current.name] = current
            if header.group(1):
                entry = current.name
            continue
        if current is None or line.strip() in ("", "}"):
            continue
        instr = _parse_instr(line)
        if instr is not None:
            current.instrs.append(instr)
            current.by_name[instr.name] = instr
    return comps, entry


def callees(instr: Instr) -> list[tuple[str, str]]:
    """(role, computation) pairs an instruction calls."""
    if instr.op.endswith(("-done", "-update")):  # the async op's -start counts its callee
        return []
    out = [(role, name) for role, name in _CALLEE.findall(instr.attrs)]
    for role, names in _CALLEE_LIST.findall(instr.attrs):
        out += [(role, n) for n in _NAME.findall(names) or names.replace(" ", "").split(",")]
    return out


def _int_constant(comp: Computation, name: str) -> int | None:
    instr = comp.by_name.get(name)
    if instr is None:
        return None
    if instr.op in ("copy", "bitcast", "convert") and instr.operands:
        return _int_constant(comp, instr.operands[0])
    if instr.op != "constant":
        return None
    try:
        return int(instr.args.strip())
    except ValueError:
        return None


def _tuple_index(comp: Computation, name: str) -> int | None:
    """The tuple index ``name`` reads from the computation's parameter, else None."""
    instr = comp.by_name.get(name)
    while instr is not None and instr.op in ("copy", "bitcast", "convert"):
        instr = comp.by_name.get(instr.operands[0]) if instr.operands else None
    if instr is None or instr.op != "get-tuple-element":
        return None
    src = comp.by_name.get(instr.operands[0]) if instr.operands else None
    if src is None or src.op != "parameter":
        return None
    m = _INDEX.search(instr.attrs)
    return int(m.group(1)) if m else None


def _trip_count(loop: Instr, caller: Computation, comps: dict[str, Computation]) -> int | None:
    """A ``while`` instruction's trip count (``hlo_cost``'s module docstring), or None when
    the HLO does not say."""
    m = _TRIP.search(loop.attrs)
    if m:
        return int(m.group(1))
    roles = dict(callees(loop))
    cond, body = comps.get(roles.get("condition", "")), comps.get(roles.get("body", ""))
    root = cond.root if cond is not None else None
    if cond is None or root is None or root.op != "compare" or len(root.operands) != 2:
        return None
    found = _DIRECTION.search(root.attrs)
    direction = found.group(1) if found else ""
    a, b = root.operands
    limit, index = _int_constant(cond, b), _tuple_index(cond, a)
    if limit is None:  # c > i is i < c
        limit, index = _int_constant(cond, a), _tuple_index(cond, b)
        direction = {"GT": "LT", "GE": "LE", "LT": "GT", "LE": "GE"}.get(direction, direction)
    if limit is None or index is None:
        return None
    start = 0
    init = caller.by_name.get(loop.operands[0]) if loop.operands else None
    if init is not None and init.op == "tuple" and index < len(init.operands):
        value = _int_constant(caller, init.operands[index])
        start = 0 if value is None else value
    step = 1
    if body is not None and body.root is not None and body.root.op == "tuple":
        upd = (
            body.by_name.get(body.root.operands[index]) if index < len(body.root.operands) else None
        )
        if upd is not None and upd.op in ("add", "subtract") and len(upd.operands) == 2:
            for x, y in (upd.operands, upd.operands[::-1]):
                c = _int_constant(body, y)
                if c and _tuple_index(body, x) == index:
                    step = c if upd.op == "add" else -c
                    break
    span = {"LT": limit - start, "LE": limit - start + 1, "NE": limit - start}.get(direction)
    if direction in ("GT", "GE"):  # counting down
        span = start - limit + (direction == "GE")
        step = -step
    if span is None or step <= 0:
        return None
    return max(0, -(-span // step))


def multipliers(
    comps: dict[str, Computation], entry: str, unknown_trips: int, *, once: bool = False
) -> tuple[dict[str, float], set[str], list[int], int]:
    """How many times each computation runs per program call; the computations that run
    inside a fusion (or another op); the loops' trip counts; how many were unknown."""
    calls: dict[str, list[tuple[str, float]]] = {}
    inner: set[str] = set()
    trips: list[int] = []
    unknown = 0
    for comp in comps.values():
        for instr in comp.instrs:
            called = callees(instr)
            if not called:
                continue
            factor = 1.0
            if instr.op == "while":
                n = _trip_count(instr, comp, comps)
                if n is None:
                    unknown += 1
                    n = unknown_trips
                trips.append(n)
                factor = 1.0 if once else float(n)
            for role, callee in called:
                f = factor if role == "body" else factor + 1 if role == "condition" else 1.0
                calls.setdefault(callee, []).append((comp.name, f))
                if instr.op not in ("while", "conditional", "call"):
                    inner.add(callee)
    mult: dict[str, float] = {entry: 1.0}

    def runs(name: str, seen: frozenset[str] = frozenset()) -> float:
        if name in mult:
            return mult[name]
        if name in seen:  # a cycle: not valid HLO
            return 0.0
        total = sum(runs(c, seen | {name}) * f for c, f in calls.get(name, []))
        mult[name] = total
        return total

    for name in comps:
        runs(name)
    return mult, inner, trips, unknown
