"""What makes a run fit: :func:`fit_advice` searches the levers of the memory estimate
(:func:`~jaxrl_llm.train.compile.memory.estimate_memory`: LoRA, remat, more chips, a bigger
device, the reference off) and ranks the setups that fit; ``jaxrl-llm memory`` prints them."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_llm.losses.registry import ALGORITHMS as LOSS_ALGORITHMS
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.train.compile.memory import (
    ALGORITHM_MEMORY,
    DEVICE_MEMORY,
    MemoryEstimate,
    Role,
    estimate_memory,
)


@dataclasses.dataclass(frozen=True)
class FitAdvice:
    """One change that makes a run fit, with the estimator's total for it.

    Attributes:
      change: what to change, as the ``jaxrl-llm memory`` flag or the config key.
      note: what it costs or needs.
      total_bytes_per_device: :func:`estimate_memory`'s total with the change.
      device: the device kind it fits on. device_bytes: its memory.
    """

    change: str
    note: str
    total_bytes_per_device: int
    device: str
    device_bytes: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


_REMAT_ORDER = ("none", "dots", "full")


def _same_family(kind: str, device: str) -> bool:
    """A TPU is compared with TPUs, a GPU with GPUs; a CPU with anything."""
    return device == "cpu" or kind.startswith("tpu-") == device.startswith("tpu-")


ADVICE_LORA_RANK = 16


def fit_advice(
    config: ModelConfig,
    algorithm: str,
    *,
    max_devices: int = 1024,
    **kwargs: Any,
) -> list[FitAdvice]:
    """The changes that make a setup that does not fit fit, each with its per-device total.

    Tried one at a time from the setup ``kwargs`` (the arguments of :func:`estimate_memory`):
    the lightest rematerialisation that fits (``dots``, then ``full``); LoRA (rank
    :data:`ADVICE_LORA_RANK`) where the algorithm supports it, and both together when neither
    fits alone; the smallest power-of-two multiple of ``fsdp`` that fits within
    ``max_devices`` devices in all; the reference's weights held off the device; the smallest
    bigger device kind of :data:`DEVICE_MEMORY` of the same family (TPU or GPU). When none of
    these fits, full remat, LoRA and more fsdp together.

    Returns:
      The changes that fit, in that order (empty when the setup fits already or nothing
      tried fits).
    """
    kwargs = dict(kwargs)
    device = kwargs.get("device", "h100")
    base = estimate_memory(config, algorithm, **kwargs)
    if base.fits:
        return []
    cap = base.device_bytes
    out: list[FitAdvice] = []

    def est(**change: Any) -> MemoryEstimate:
        return estimate_memory(config, algorithm, **{**kwargs, **change})

    def add(change: str, note: str, e: MemoryEstimate) -> None:
        out.append(FitAdvice(change, note, e.total_bytes_per_device, device, cap))

    current = _REMAT_ORDER.index(kwargs.get("remat", "none"))
    for remat in _REMAT_ORDER[current + 1 :]:
        if (e := est(remat=remat)).fits:
            add(f"--remat {remat}", "recomputes activations in the backward pass", e)
            break
    lora_ok = LOSS_ALGORITHMS[algorithm].lora and not kwargs.get("lora_rank")
    if lora_ok and (e := est(lora_rank=ADVICE_LORA_RANK)).fits:
        add(f"--lora-rank {ADVICE_LORA_RANK}", "model.lora: trains adapters, base frozen", e)
    combo: dict[str, Any] = {"remat": "full"}
    if lora_ok:
        combo["lora_rank"] = ADVICE_LORA_RANK
    flags = "--remat full" + (f" --lora-rank {ADVICE_LORA_RANK}" if lora_ok else "")
    if not out and lora_ok and current < 2 and (e := est(**combo)).fits:
        add(flags, "both", e)
    fsdp = kwargs.get("fsdp", 1)
    used = kwargs.get("data", 1) * kwargs.get("tensor", 1) * kwargs.get("expert", 1)
    f = fsdp * 2
    while f * used <= max_devices:
        if (e := est(fsdp=f)).fits:
            add(f"fsdp={f}", f"{f * used} devices; weights and optimizer state split {f} ways", e)
            break
        f *= 2
    if ALGORITHM_MEMORY[algorithm].online:  # fewer rows per forward/backward: more updates a step
        mb = kwargs.get("minibatches", 1) * 2
        rows = kwargs.get("batch_size", 8) * kwargs.get("group_size", 1)
        while mb <= rows and rows % mb == 0:
            if (e := est(minibatches=mb)).fits:
                add(
                    f"--minibatches {mb}",
                    f"rollout.minibatches={mb}: {mb} optimizer updates per step, each on "
                    f"1/{mb} of the rows (more off-policy: the later updates' rows are older)",
                    e,
                )
                break
            mb *= 2
    devices = fsdp * kwargs.get("data", 1) * kwargs.get("tensor", 1)
    t = kwargs.get("tensor", 1) * 2
    while t <= min(devices, 8) and devices % t == 0:  # the learner's heads / MLP split too
        f = devices // t
        if config.num_kv_heads % t == 0 and (e := est(fsdp=f, data=1, tensor=t)).fits:
            add(f"--mesh fsdp={f},tensor={t}", f"activations and weights split {t} ways", e)
            break
        t *= 2
    uses_ref = Role.REFERENCE in ALGORITHM_MEMORY[algorithm].roles and not kwargs.get("lora_rank")
    if uses_ref and (e := est(reference_offloaded=True)).fits:
        add(
            "reference in host memory",
            "not built into jaxrl_llm's trainers; with LoRA the reference is the base, free",
            e,
        )
    for nbytes, kind in sorted((b, d) for d, b in DEVICE_MEMORY.items() if b > cap):
        if _same_family(kind, device) and base.total_bytes_per_device <= nbytes:
            note = "a device with more memory"
            out.append(
                FitAdvice(f"--device {kind}", note, base.total_bytes_per_device, kind, nbytes)
            )
            break
    if not out:  # nothing alone: remat, LoRA and more fsdp together
        f = fsdp * 2
        while f * used <= max_devices:
            if (e := est(**combo, fsdp=f)).fits:
                add(f"{flags} fsdp={f}", f"together; {f * used} devices", e)
                break
            f *= 2
    return out
