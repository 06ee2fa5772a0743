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
      hlo_flops: matmul FLOPs per device of one call with loop trip counts applied (the
        layers' scan counted L times; :func:`~jaxrl_llm.train.compile.hlo_cost.hlo_cost`).
        hlo_flops_once: the same with each loop body counted once, as ``flops`` counts it
        (``flops`` adds elementwise work; the two agree within a few percent when matmuls
        dominate).
      hbm_access_bytes: HBM bytes read and written per device in one call, trip counts
        applied; ``copy_bytes`` the part of it spent only moving data (copies, relayouts,
        slices copied out: :func:`~jaxrl_llm.train.compile.hlo_cost.is_copy`).
        collective_bytes: bytes one device sends in collectives in one call (ring
        model), trip counts applied; ``collectives`` by kind; ``collective_hops`` the link
        hops they wait through in sequence (:func:`~jaxrl_llm.train.compile.hlo_cost.
        collective_hops`), what the modeled time charges latency for.
      trip_counts: the program's loops' trip counts. unknown_loops: loops whose count the
        HLO does not say (the decode loop: counted as ``max_new_tokens`` steps, every row
        running to the end).
      model_flops: the model's FLOPs per device of one call, 2·N per token forward and
        6·N per token for a train step (no recomputation counted; N the active parameters
        less an untied input embedding, attention's T² term left out); None where not
        defined.
      calls_per_step: how many times a training step runs the program (the train step once
        per optimizer update).
      notes: program-specific figures per device and call (the decode loop: the HBM bytes
        of reading its weights, ``weight_bytes``, and its KV cache, ``kv_bytes``, once per
        step: the model's split of what it reads; ``kv_written_bytes``: only the slots
        written so far, read once per step, which with the weights is the decode floor).
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
    hlo_flops: float = 0.0
    hlo_flops_once: float = 0.0
    hbm_access_bytes: float = 0.0
    copy_bytes: float = 0.0
    collective_hops: float = 0.0
    collective_bytes: float = 0.0
    collectives: dict[str, float] = dataclasses.field(default_factory=dict)
    trip_counts: tuple[int, ...] = ()
    unknown_loops: int = 0
    model_flops: float | None = None
    calls_per_step: int = 1
    notes: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """The program's own footprint: arguments + outputs − aliased + temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def peak_bytes(self) -> int:
        """Footprint + the run's arrays that live through it without being arguments."""
        return self.total_bytes + self.resident_bytes


@dataclasses.dataclass(frozen=True)
class Roofline:
    """A program's time bound on one device from its work and the chip's datasheet:
    ``max(flops / peak, HBM bytes / HBM bandwidth, collective bytes / ICI bandwidth)``, each
    term as if nothing overlapped it, so the program cannot run faster than ``seconds``
    (and may run slower: the terms add up where they do not overlap).

    Attributes:
      compute_s, hbm_s, ici_s: the three terms (``ici_s`` None without an ICI number).
      seconds: the largest. bound: which term it is ("compute", "HBM", "ICI").
      mfu: ``model_flops / (seconds · peak)``, the model FLOPs utilisation the bound
        implies (an upper bound on the MFU the program can reach); None without model FLOPs.
      latency_s: the collectives' latency, ``collective_hops`` × the chip's per-hop latency
        (:data:`~jaxrl_llm.train.compile.step_model.HOP_LATENCY_S`), none of it overlapped.
      prefill_s: the decode program's prefill, which ``compile`` does not lower:
        ``max(prefill FLOPs / peak, weight bytes / HBM bandwidth)`` (0 for other programs).
      modeled_s: ``seconds + latency_s + prefill_s``, the modeled time (still no host work,
        no launch gaps, no imperfect overlap inside a term). modeled_mfu: the MFU against it.
    """

    compute_s: float
    hbm_s: float
    ici_s: float | None
    seconds: float
    bound: str
    mfu: float | None
    latency_s: float = 0.0
    prefill_s: float = 0.0
    modeled_s: float = 0.0
    modeled_mfu: float | None = None


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """Compiled memory of a run's programs next to the estimator's number.

    Attributes:
      topology: the slice name. algorithm: the algorithm. mesh: axis sizes.
      hbm_bytes: HBM per device. programs: per-program memory. resident: the arrays alive
      through the step (name -> bytes/device). estimate: :func:`estimate_memory`'s result,
      or None where it has no model of the run (a ``context`` axis > 1: ring attention).
      settings: the run settings the programs were built with.
      chip: the device's datasheet numbers for the roofline: ``peak_flops``,
        ``hbm_bandwidth``, ``ici_bandwidth`` (per device; :mod:`jaxrl_llm.parallel.topology`).
    """

    topology: str
    algorithm: str
    mesh: dict[str, int]
    hbm_bytes: int
    programs: tuple[ProgramMemory, ...]
    resident: dict[str, int]
    estimate: MemoryEstimate | None
    settings: dict[str, Any]
    chip: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def roofline(self, p: ProgramMemory) -> Roofline | None:
        """The roofline of one program on this report's chip (None without the chip)."""
        peak, hbm_bw = self.chip.get("peak_flops"), self.chip.get("hbm_bandwidth")
        if not peak or not hbm_bw:
            return None
        ici_bw = self.chip.get("ici_bandwidth")
        terms = {"compute": p.hlo_flops / peak, "HBM": p.hbm_access_bytes / hbm_bw}
        if ici_bw:
            terms["ICI"] = p.collective_bytes / ici_bw
        bound = max(terms, key=lambda k: terms[k])
        seconds = terms[bound]
        latency = p.collective_hops * float(self.chip.get("hop_latency") or 0.0)
        prefill = max(
            p.notes.get("prefill_flops", 0.0) / peak, p.notes.get("prefill_bytes", 0.0) / hbm_bw
        )
        modeled = seconds + latency + prefill
        mfu = modeled_mfu = None
        if p.model_flops is not None and seconds > 0:
            mfu = p.model_flops / (seconds * peak)
            modeled_mfu = (p.model_flops + p.notes.get("prefill_flops", 0.0)) / (modeled * peak)
        return Roofline(
            compute_s=terms["compute"],
            hbm_s=terms["HBM"],
            ici_s=terms.get("ICI"),
            seconds=seconds,
            bound=bound,
            mfu=mfu,
            latency_s=latency,
            prefill_s=prefill,
            modeled_s=modeled,
            modeled_mfu=modeled_mfu,
        )

    def step_roofline(self, *, modeled: bool = False) -> tuple[float, float | None] | None:
        """(seconds, MFU) of one training step: each program's roofline (``modeled``: its
        modeled time, :attr:`Roofline.modeled_s`, and its prefill's FLOPs) times its calls
        per step, summed; MFU = the model FLOPs of those calls / (seconds · peak). None
        without the chip; the MFU None when a program has no model FLOPs."""
        lines = [(p, self.roofline(p)) for p in self.programs]
        if any(r is None for _, r in lines):
            return None
        seconds = sum(
            p.calls_per_step * (r.modeled_s if modeled else r.seconds)
            for p, r in lines
            if r is not None
        )
        extra = lambda p: p.notes.get("prefill_flops", 0.0) if modeled else 0.0
        flops = [
            p.calls_per_step * (p.model_flops + extra(p))
            for p, _ in lines
            if p.model_flops is not None
        ]
        peak = self.chip.get("peak_flops") or 0.0
        if len(flops) < len(lines) or seconds <= 0 or not peak:
            return seconds, None
        return seconds, sum(flops) / (seconds * peak)

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
            "chip": self.chip,
            "programs": [
                {
                    **dataclasses.asdict(p),
                    "total_bytes": p.total_bytes,
                    "peak_bytes": p.peak_bytes,
                    "roofline": _asdict(self.roofline(p)),
                }
                for p in self.programs
            ],
            "step_roofline": _step_json(self.step_roofline()),
            "step_modeled": _step_json(self.step_roofline(modeled=True)),
            "throughput": self.throughput(),
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

    def _work_lines(self) -> list[str]:
        """The per-device work and roofline block of :meth:`table`."""
        lines = [
            "",
            f"{'program':<10} {'calls':>5} {'TFLOP':>9} {'model':>9} {'HBM GB':>9} "
            f"{'coll. GB':>9} {'roofline':>10} {'bound':>7} {'MFU':>6}   (per device, one call)",
            "-" * 88,
        ]
        for p in self.programs:
            r = self.roofline(p)
            model = "-" if p.model_flops is None else f"{p.model_flops / 1e12:9.2f}"
            lines.append(
                f"{p.name:<10} {p.calls_per_step:>5} {p.hlo_flops / 1e12:9.2f} {model:>9} "
                f"{p.hbm_access_bytes / 1e9:9.2f} {p.collective_bytes / 1e9:9.2f} "
                + (
                    "        -       -      -"
                    if r is None
                    else f"{r.seconds * 1e3:8.1f}ms {r.bound:>7} "
                    + ("     -" if r.mfu is None else f"{r.mfu:6.1%}")
                )
            )
        lines.append("-" * 88)
        step = self.step_roofline()
        if step is not None:
            mfu = "" if step[1] is None else f", MFU at most {step[1]:.1%}"
            lines.append(f"step (programs x calls): roofline {step[0] * 1e3:.1f} ms{mfu}")
        modeled = self.step_roofline(modeled=True)
        if modeled is not None:
            mfu = "" if modeled[1] is None else f", MFU {modeled[1]:.1%}"
            lines.append(
                f"step modeled (+ collective latency, + decode's prefill): "
                f"{modeled[0] * 1e3:.1f} ms{mfu}"
            )
        lines += self._throughput_lines()
        lines.append(
            "TFLOP: matmul FLOPs from the compiled HLO with loop trip counts applied; model: "
            "2N per token forward, 6N train (no remat); roofline = max(FLOP / peak, HBM "
            "bytes / HBM bandwidth, collective bytes / ICI bandwidth), datasheet numbers"
        )
        unknown = [p.name for p in self.programs if p.unknown_loops]
        if unknown:
            lines.append(
                "loops without a trip count in the HLO counted at their bound (decode: "
                f"max_new_tokens steps): {', '.join(unknown)}"
            )
        return lines

    def throughput(self) -> dict[str, float]:
        """Tokens per second per chip at the roofline: ``decode`` (generated tokens over the
        decode loop's time) and ``step`` (every row's prompt + completion tokens over the
        whole step's time), with the decode loop's bytes split into weights and KV cache
        (GB per device and rollout). {} without a chip or a decode program."""
        decode = next((p for p in self.programs if p.name == "decode"), None)
        step = self.step_roofline()
        r = None if decode is None else self.roofline(decode)
        if decode is None or r is None or step is None or r.seconds <= 0:
            return {}
        if "batch_size" not in self.settings or "seq_len" not in self.settings:
            return {}
        s = self.settings
        devices = max(int(s.get("devices", 1)), 1)
        rows = int(s["batch_size"]) * int(s.get("group_size") or 1)
        gen = int(s["seq_len"]) - int(s["prompt_len"])
        return {
            "decode_tokens_per_s_per_chip": rows * gen / devices / r.seconds,
            "step_tokens_per_s_per_chip": rows * int(s["seq_len"]) / devices / step[0],
            "decode_s": r.seconds,
            "decode_modeled_s": r.modeled_s,
            "step_modeled_tokens_per_s_per_chip": rows
            * int(s["seq_len"])
            / devices
            / (self.step_roofline(modeled=True) or step)[0],
            "decode_weight_gb": decode.notes.get("weight_bytes", 0.0) / 1e9,
            "decode_kv_gb": decode.notes.get("kv_bytes", 0.0) / 1e9,
            "decode_hbm_gb": decode.hbm_access_bytes / 1e9,
            "decode_copy_gb": decode.copy_bytes / 1e9,
            "decode_floor_gb": (
                decode.notes.get("weight_bytes", 0.0) + decode.notes.get("kv_written_bytes", 0.0)
            )
            / 1e9,
            "decode_collective_gb_per_token_step": decode.collective_bytes / max(gen, 1) / 1e9,
        }

    def _throughput_lines(self) -> list[str]:
        t = self.throughput()
        if not t:
            return []
        layout = self.settings.get("sampler")
        return [
            *([f"sampler: {layout}"] if layout else []),
            f"decode: {t['decode_s']:.3f} s per rollout, "
            f"{t['decode_tokens_per_s_per_chip']:,.0f} generated tokens/s per chip; reads "
            f"{t['decode_weight_gb']:.1f} GB of weights and {t['decode_kv_gb']:.1f} GB of KV "
            f"cache per device (model); {t['decode_collective_gb_per_token_step']:.3f} GB of "
            "collectives per token step",
            f"decode HBM: {t['decode_hbm_gb']:.1f} GB per device (HLO), of which "
            f"{t['decode_copy_gb']:.1f} GB copies; floor {t['decode_floor_gb']:.1f} GB "
            "(weights + the KV slots written so far, read once per step)",
            f"step: {t['step_tokens_per_s_per_chip']:,.0f} tokens/s per chip (prompt + "
            "completion tokens of every row over the step's roofline), "
            f"{t['step_modeled_tokens_per_s_per_chip']:,.0f} over its modeled time",
        ]

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
        lines += self._work_lines()
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


def _asdict(r: Roofline | None) -> dict[str, Any] | None:
    return None if r is None else dataclasses.asdict(r)


def _step_json(step: tuple[float, float | None] | None) -> dict[str, Any] | None:
    return None if step is None else {"seconds": step[0], "mfu": step[1]}
