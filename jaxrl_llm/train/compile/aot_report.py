"""The records of ``jaxrl-llm compile``: one compiled program's per-device memory, and the
run's report beside the estimate (see :mod:`jaxrl_llm.train.compile.aot`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_llm.train.compile.memory import GiB, MemoryEstimate


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    """One compiled program's per-device memory and cost, from XLA.

    Attributes:
      name: ``train``, ``reference``, ``critic``, ``recompute`` (``rollout.correction``) or
        ``decode``.
      argument_bytes, output_bytes, alias_bytes, temp_bytes, code_bytes: XLA's
        ``memory_analysis()`` per device (alias = outputs written into donated arguments).
      flops: XLA's ``cost_analysis()["flops"]`` per device, one call of the program.
      resident_bytes: arrays alive during this program that are not its arguments.
      collective_permutes: collective-permute ops in the compiled program: on a context mesh
        ring attention's transfers between neighbours, but the TPU compiler also emits some
        for its own collectives (an 8B step on ``fsdp=8`` has a few), so > 0 alone does not
        prove a ring.
      largest_buffers: the largest per-device arrays the compiled program computes, as
        ``"bf16[8,512,14336] 112.0 MiB"`` (:func:`~jaxrl_llm.train.compile.aot_inputs.
        largest_buffers`): an activation split by rows over N devices shows B / N rows.
    """

    name: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    flops: float
    resident_bytes: int
    collective_permutes: int = 0
    largest_buffers: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """The program's own footprint: arguments + outputs − aliased + temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def peak_bytes(self) -> int:
        """Footprint + the run's arrays that live through it without being arguments."""
        return self.total_bytes + self.resident_bytes


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """Compiled memory of a run's programs next to the estimator's number.

    Attributes:
      topology: the slice name. algorithm: the algorithm. mesh: axis sizes.
      hbm_bytes: HBM per device. programs: per-program memory. resident: the arrays alive
      through the step (name -> bytes/device). estimate: :func:`estimate_memory`'s result,
      or None where it has no model of the run (a ``context`` axis > 1: ring attention).
      settings: the run settings the programs were built with.
    """

    topology: str
    algorithm: str
    mesh: dict[str, int]
    hbm_bytes: int
    programs: tuple[ProgramMemory, ...]
    resident: dict[str, int]
    estimate: MemoryEstimate | None
    settings: dict[str, Any]

    @property
    def peak_bytes(self) -> int:
        """Largest program footprint + resident arrays: the compiled per-device peak."""
        return max(p.peak_bytes for p in self.programs)

    @property
    def fits(self) -> bool:
        """Whether the compiled peak fits in one device's HBM."""
        return self.peak_bytes <= self.hbm_bytes

    @property
    def estimate_ratio(self) -> float | None:
        """Estimate / compiled peak (1.0 = exact); None without an estimate."""
        if self.estimate is None:
            return None
        return self.estimate.total_bytes_per_device / max(self.peak_bytes, 1)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (bytes are ints; programs carry their totals)."""
        return {
            "topology": self.topology,
            "algorithm": self.algorithm,
            "mesh": self.mesh,
            "settings": self.settings,
            "hbm_bytes_per_device": int(self.hbm_bytes),
            "programs": [
                {**dataclasses.asdict(p), "total_bytes": p.total_bytes, "peak_bytes": p.peak_bytes}
                for p in self.programs
            ],
            "resident": {k: int(v) for k, v in self.resident.items()},
            "compiled_peak_bytes": int(self.peak_bytes),
            "estimate_bytes": (
                None if self.estimate is None else int(self.estimate.total_bytes_per_device)
            ),
            "estimate_over_compiled": (
                None if self.estimate_ratio is None else round(self.estimate_ratio, 4)
            ),
            "fits": self.fits,
        }

    def table(self) -> str:
        """A plain-text report for the terminal."""
        g = lambda b: f"{b / GiB:9.3f}"
        lines = [
            f"{'program':<10} {'args':>9} {'outputs':>9} {'aliased':>9} {'temps':>9} "
            f"{'total':>9} {'+resident':>9} {'TFLOP':>9}   (GiB per device)",
            "-" * 88,
        ]
        for p in self.programs:
            lines.append(
                f"{p.name:<10} {g(p.argument_bytes)} {g(p.output_bytes)} "
                f"{g(p.alias_bytes)} {g(p.temp_bytes)} {g(p.total_bytes)} "
                f"{g(p.peak_bytes)} {p.flops / 1e12:9.2f}"
            )
        lines.append("-" * 88)
        lines.append(
            "TFLOP: XLA's cost analysis, which counts a loop body (the scan over layers,"
            " micro-batches, decode steps) once; 6N (8N with full remat) per token: "
            f"{self.settings['train_flops_analytic'] / 1e12:.2f} TFLOP per device and "
            f"update"
        )
        for p in self.programs:
            if p.largest_buffers:
                lines.append(f"largest arrays, {p.name}: " + ", ".join(p.largest_buffers))
        for name, b in self.resident.items():
            lines.append(f"resident: {name:<32} {b / GiB:9.3f} GiB")
        verdict = "fits" if self.fits else "does NOT fit"
        if self.estimate is None or self.estimate_ratio is None:
            estimate = "     none (no model of ring attention: context > 1)"
        else:
            estimate = (
                f"{self.estimate.total_bytes_per_device / GiB:9.3f} GiB  "
                f"({self.estimate_ratio:.2f}x the compiled peak)"
            )
        lines += [
            f"compiled peak per device          {self.peak_bytes / GiB:9.3f} GiB",
            f"estimate (jaxrl-llm memory)       {estimate}",
            f"HBM per device ({self.topology})  {self.hbm_bytes / GiB:9.3f} GiB; verdict: "
            f"{verdict}",
        ]
        return "\n".join(lines)
