"""Where one call of a jitted program spends its time, per XLA operation (any backend).

``jax.profiler.trace`` records one event per executed XLA operation (on CPU, one per thunk:
a fusion, a dot, a copy, a loop), named after the instruction of the compiled HLO. This module
runs the program once under the profiler, takes each operation's *self* time (its duration
minus the operations nested in it on the same thread, so a ``while`` loop counts only its own
bookkeeping), and joins the names to the compiled HLO to say what each operation is:

* **phase** from the instruction's ``op_name`` metadata, which JAX writes as the path of
  transformations that produced it: ``transpose(jvp(...))`` is the backward pass, ``jvp(...)``
  the forward pass of a differentiated function, anything else (optimizer, guard, metrics,
  the plain forward of an undifferentiated program) is "other", and an operation without
  metadata (one XLA made itself, e.g. a layout change it inserted) is "unattributed";
* **kind**: ``matmul`` when the operation is or fuses a ``dot`` / ``convolution``; ``copy /
  layout`` for copies, transposes, (dynamic-)slices and concatenations (data movement);
  ``control flow`` for ``while`` / ``conditional`` / ``call`` bookkeeping; ``elementwise /
  reduce`` for every other fusion or op (softmax, norms, RoPE, the optimizer's arithmetic).

Used by ``profile_train_step.py``; on its own::

    from xla_trace import op_time_breakdown
    rows = op_time_breakdown(jitted_fn, *args)
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
from typing import Any

import jax

KINDS = ("matmul", "elementwise / reduce", "copy / layout", "control flow")
PHASES = ("forward", "backward", "other", "unattributed")

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\S+(?:\s*\{[^}]*\})?\s+([\w\-]+)\(")
_COMP = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_DATA_MOVEMENT = {
    "copy",
    "transpose",
    "slice",
    "dynamic-slice",
    "dynamic-update-slice",
    "concatenate",
    "pad",
    "broadcast",
    "reshape",
    "bitcast",
    "gather",
    "scatter",
    "copy-start",
    "copy-done",
}
_CONTROL = {"while", "conditional", "call", "async-start", "async-done"}


def parse_hlo(text: str) -> dict[str, dict[str, Any]]:
    """``{instruction name: {"opcode", "op_name", "calls", "computation"}}`` from HLO text,
    plus ``{computation name: [opcodes]}`` under the key ``"__computations__"``."""
    instrs: dict[str, dict[str, Any]] = {}
    comps: dict[str, list[str]] = collections.defaultdict(list)
    current = None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m and "=" not in line.split("{")[0]:
            current = m.group(1)
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name, opcode = m.group(1), m.group(2)
        op_name = re.search(r'op_name="([^"]*)"', line)
        calls = re.search(r"calls=%?([\w.\-]+)", line)
        instrs[name] = {
            "opcode": opcode,
            "op_name": op_name.group(1) if op_name else "",
            "calls": calls.group(1) if calls else None,
            "computation": current,
        }
        if current is not None:
            comps[current].append(opcode)
    instrs["__computations__"] = dict(comps)  # type: ignore[assignment]
    return instrs


def classify(name: str, hlo: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """(phase, kind) of the HLO instruction ``name`` (see the module docstring)."""
    info = hlo.get(name)
    if info is None:
        base = name.split(".")[0]
        info = {"opcode": base, "op_name": "", "calls": None}
    op_name = info["op_name"]
    if not op_name:
        phase = "unattributed"
    elif "transpose(" in op_name:
        phase = "backward"
    elif "jvp(" in op_name:
        phase = "forward"
    else:
        phase = "other"
    opcode = info["opcode"]
    body = hlo["__computations__"].get(info["calls"], []) if info["calls"] else []
    if opcode in ("dot", "convolution") or "dot" in body or "convolution" in body:
        kind = "matmul"
    elif opcode in _CONTROL:
        kind = "control flow"
    elif opcode in _DATA_MOVEMENT or (
        opcode == "fusion" and body and set(body) <= _DATA_MOVEMENT | {"parameter", "constant"}
    ):
        kind = "copy / layout"
    else:
        kind = "elementwise / reduce"
    return phase, kind


def self_times(events: list[dict]) -> dict[str, float]:
    """Per event name, the summed self time in seconds (duration minus nested events on the
    same thread)."""
    by_tid: dict[Any, list[dict]] = collections.defaultdict(list)
    for e in events:
        by_tid[(e.get("pid"), e.get("tid"))].append(e)
    out: dict[str, float] = collections.defaultdict(float)
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [event, child time]
        for e in evs:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                done, child = stack.pop()
                out[done["name"]] += (done["dur"] - child) * 1e-6
            if stack:
                stack[-1][1] += e["dur"]
            stack.append([e, 0.0])
        while stack:
            done, child = stack.pop()
            out[done["name"]] += (done["dur"] - child) * 1e-6
    return out


def op_time_breakdown(jitted, *args, trace_dir: str | None = None) -> dict[str, Any]:
    """Run ``jitted(*args)`` once under the profiler (call it once before, to compile).

    Returns:
      ``{"total_s": Σ self time of the program's operations, "table": {(phase, kind): s},
      "top": [(name, seconds, phase, kind, op_name)] sorted by time}``.
    """
    hlo = parse_hlo(jitted.lower(*args).compile().as_text())
    names = {k for k in hlo if k != "__computations__"}
    d = trace_dir or tempfile.mkdtemp(prefix="xla_trace_")
    with jax.profiler.trace(d):
        jax.block_until_ready(jitted(*args))
    files = sorted(
        glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True), key=os.path.getmtime
    )
    if not files:
        raise RuntimeError(f"the profiler wrote no trace under {d}")
    with gzip.open(files[-1], "rt", encoding="utf-8") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    # Only the program's own operations: names of its HLO instructions.
    ops = [e for e in events if e["name"] in names]
    if not ops:
        raise RuntimeError(
            "the trace holds no per-operation events for this program "
            "(this backend's profiler does not record them)"
        )
    times = self_times(ops)
    table: dict[tuple[str, str], float] = collections.defaultdict(float)
    top = []
    for name, s in times.items():
        phase, kind = classify(name, hlo)
        table[(phase, kind)] += s
        top.append((name, s, phase, kind, hlo[name]["op_name"]))
    top.sort(key=lambda r: -r[1])
    return {"total_s": sum(times.values()), "table": dict(table), "top": top}
