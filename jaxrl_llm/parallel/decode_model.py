"""The sampler's decode step as a model, for choosing its tensor-parallel degree.

One decode step of a tensor-parallel replica reads its shard of the weights and its rows' KV
heads from HBM once, and all-reduces the rows' hidden states twice per layer over the chips'
links (Megatron-LM, Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053).
:func:`choose_sampler_tensor` takes the degree with the fastest modeled step among those that
fit HBM; :func:`auto_tensor` is what ``rollout.tensor: auto``, ``jaxrl-llm memory`` and
``jaxrl-llm compile`` all call. Chips come from datasheets, through the one chip table
(:data:`jaxrl_llm.parallel.chips.CHIPS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from jaxrl_llm.parallel.chips import CHIPS, chip_kind

#: The time one all-reduce of a decode step's hidden states takes on top of its bytes
#: (launch and synchronisation). An assumption of the model, not a measurement: 10 µs is
#: the order of one small ICI / NVLink collective.
ALLREDUCE_LATENCY_S = 10e-6


@dataclasses.dataclass(frozen=True)
class Chip:
    """What the decode model needs of a chip: HBM bytes and bandwidth, interconnect bandwidth
    (bytes/s one way or both, as the datasheet gives it; None: unknown)."""

    name: str
    hbm_bytes: float
    hbm_bandwidth: float
    link_bandwidth: float | None


@dataclasses.dataclass(frozen=True)
class DecodeCost:
    """One tensor degree in the decode model (:func:`choose_sampler_tensor`)."""

    tensor: int
    bytes_per_chip: float
    step_s: float
    fits: bool


def decode_step_cost(
    t: int,
    *,
    devices: int,
    weight_bytes: float,
    kv_bytes_per_row: float,
    rows: int,
    layers: int,
    hidden: int,
    chip: Chip,
    free_bytes: float | None = None,
) -> DecodeCost:
    """The modeled seconds of one decode step at tensor degree ``t`` on ``devices`` sampler
    devices: ``(W / t + rows_per_replica × KV / t) / HBM bandwidth`` (each chip reads its
    weight shard and its rows' KV heads once per step) + ``2 L`` all-reduces of the replica's
    hidden states ``[rows_per_replica, hidden]`` in bf16 (ring: ``2 (t−1)/t`` of the bytes
    over the link, plus :data:`ALLREDUCE_LATENCY_S` each) when ``t > 1``."""
    replicas = max(devices // t, 1)
    rows_here = -(-rows // replicas)
    held = weight_bytes / t + rows_here * kv_bytes_per_row / t
    step = held / chip.hbm_bandwidth
    if t > 1:
        ar_bytes = 2 * (t - 1) / t * rows_here * hidden * 2
        link = chip.link_bandwidth or chip.hbm_bandwidth
        step += 2 * layers * (ALLREDUCE_LATENCY_S + ar_bytes / link)
    budget = chip.hbm_bytes if free_bytes is None else free_bytes
    return DecodeCost(t, held, step, held <= budget)


def choose_sampler_tensor(
    candidates: Sequence[int], chip: Chip | None, **model: Any
) -> tuple[int, str, list[DecodeCost]]:
    """``(t, why, costs)``: the tensor degree among ``candidates`` with the fastest modeled
    decode step that fits (:func:`decode_step_cost`; ``model``: its keywords), the reason in
    one line, and every candidate's cost. Without a chip model (CPU devices, which share one
    host's memory and cores: splitting weights buys no bandwidth) the smallest degree that
    fits ``model["free_bytes"]`` when it is given (else the smallest degree)."""
    if chip is None or not chip.hbm_bandwidth or not candidates:
        return _smallest_that_fits(candidates, **model)
    costs = [decode_step_cost(t, chip=chip, **model) for t in candidates]
    fits = [c for c in costs if c.fits]
    if not fits:
        best = min(costs, key=lambda c: c.bytes_per_chip)
        return (
            best.tensor,
            (
                f"tensor={best.tensor}: no degree fits {chip.name}'s HBM; the one holding the "
                f"least ({best.bytes_per_chip / 1e9:.1f} GB per chip)"
            ),
            costs,
        )
    best = min(fits, key=lambda c: c.step_s)
    base = costs[0]
    return (
        best.tensor,
        (
            f"tensor={best.tensor}: modeled decode step {best.step_s * 1e3:.2f} ms "
            f"({best.bytes_per_chip / 1e9:.2f} GB read per chip) against "
            f"{base.step_s * 1e3:.2f} ms at tensor={base.tensor}, on {chip.name}"
        ),
        costs,
    )


def _smallest_that_fits(candidates: Sequence[int], **model: Any) -> tuple[int, str, list]:
    """:func:`choose_sampler_tensor` without a chip model: the smallest degree whose copy and
    KV cache fit ``free_bytes`` (no bandwidth to rank by); the smallest one when no budget
    is given, the one holding the least (and why) when none fits."""
    if not candidates:
        return 1, "tensor=1: no chip model for these devices (CPU), the smallest degree", []
    free = model.get("free_bytes")
    if free is None:
        t = min(candidates)
        return t, f"tensor={t}: no chip model for these devices (CPU), the smallest degree", []
    cpu = Chip("cpu", float(free), 1.0, None)  # the bandwidth ranks nothing here
    costs = [decode_step_cost(t, chip=cpu, **model) for t in sorted(candidates)]
    fits = [c for c in costs if c.fits]
    if fits:
        c = fits[0]
        return (
            c.tensor,
            (
                f"tensor={c.tensor}: the smallest degree whose copy and KV cache fit the memory "
                f"left ({c.bytes_per_chip / 1e9:.1f} of {free / 1e9:.1f} GB per device; CPU: no "
                "bandwidth model)"
            ),
            costs,
        )
    best = min(costs, key=lambda c: c.bytes_per_chip)
    return (
        best.tensor,
        (
            f"tensor={best.tensor}: no degree fits the {free / 1e9:.1f} GB per device left; the "
            f"one holding the least ({best.bytes_per_chip / 1e9:.1f} GB per device)"
        ),
        costs,
    )


def tensor_candidates(local_devices: int, heads: int, kv_heads: int) -> list[int]:
    """Tensor degrees that divide a process's devices, the attention heads and the KV heads
    (so the KV cache splits by KV heads and nothing falls back to replication)."""
    return [
        t
        for t in range(1, local_devices + 1)
        if local_devices % t == 0 and heads % t == 0 and kv_heads % t == 0
    ]


def auto_tensor(
    config: Any,
    *,
    devices: int,
    local_devices: int,
    rows: int,
    tokens: int,
    chip: Chip | None,
    dtype: str | None,
    free_bytes: float | None = None,
    cross_process: bool = False,
) -> tuple[int, str]:
    """``(t, why)``: the sampler's tensor degree for the model ``config`` (a
    :class:`~jaxrl_llm.models.ModelConfig`) on ``devices`` sampler devices, ``local_devices``
    of them per process, decoding ``rows`` rows (all processes') of ``tokens`` cache slots in
    ``dtype`` (:func:`choose_sampler_tensor` over :func:`tensor_candidates`: divisors of
    ``local_devices``, and with ``cross_process`` multiples of it that divide ``devices``).
    What ``rollout.tensor: auto`` runs with, and what ``jaxrl-llm memory`` and ``compile``
    estimate with."""
    itemsize = jnp.dtype(dtype or "bfloat16").itemsize
    k, e = config.store_kv_heads, config.store_head_dim
    model = dict(
        devices=devices,
        weight_bytes=config.num_params() * itemsize,
        kv_bytes_per_row=2 * config.num_kv_layers * k * e * itemsize * tokens,
        rows=rows,
        layers=config.num_layers,
        hidden=config.hidden_size,
        free_bytes=free_bytes,
    )
    cands = tensor_candidates(local_devices, config.num_heads, config.num_kv_heads)
    if cross_process:
        cands += [
            t
            for t in range(2 * local_devices, devices + 1, local_devices)
            if devices % t == 0 and config.num_heads % t == 0 and config.num_kv_heads % t == 0
        ]
    t, why, costs = choose_sampler_tensor(cands, chip, **model)
    if chip is not None and costs and not any(c.fits for c in costs):
        return 0, (
            f"no tensor degree fits a copy of the weights and the KV cache in {chip.name}'s "
            f"HBM ({min(c.bytes_per_chip for c in costs) / 1e9:.1f} GB per chip at best): "
            f"decoding on the learner's layout"
        )
    return t, why


def kind_chip(kind: str) -> Chip | None:
    """The :class:`Chip` of a device kind as ``jaxrl-llm memory`` names it (``tpu-v5p``,
    ``h100``; None for ``cpu`` or a kind not in :data:`~jaxrl_llm.parallel.chips.CHIPS`)."""
    spec = CHIPS.get(kind)
    if spec is None:
        return None
    return Chip(kind, spec.hbm_bytes, spec.hbm_bandwidth, spec.link_bandwidth)


def host_devices(kind: str, devices: int) -> int:
    """Devices one host (process) of ``kind`` has in a job of ``devices``: 4 TPU chips per
    v4 / v5p host, 8 per v5e / v6e host up to an 8-chip slice and 4 beyond (Google Cloud's
    TPU system architecture pages), 8 GPUs per node; never more than the job has."""
    if kind in ("tpu-v4", "tpu-v5p"):
        per = 4
    elif kind.startswith("tpu-"):
        per = 8 if devices <= 8 else 4
    else:
        per = 8
    return max(min(per, devices), 1)


def tpu_chip(topology: Any) -> Chip:
    """The decode model's :class:`Chip` of a :class:`~jaxrl_llm.parallel.topology.Topology`."""
    return Chip(
        topology.name,
        float(topology.hbm_bytes_per_device),
        float(topology.hbm_bandwidth_per_device),
        topology.ici_bandwidth_per_device,
    )


def device_chip(device: Any) -> Chip | None:
    """The :class:`Chip` of a real device from its ``device_kind`` (None: a CPU or an
    accelerator with no entry in :data:`~jaxrl_llm.parallel.chips.CHIPS`)."""
    if device.platform not in ("gpu", "tpu"):
        return None
    kind = chip_kind(str(getattr(device, "device_kind", "")))
    if kind is None or kind.startswith("tpu-") != (device.platform == "tpu"):
        return None
    spec = CHIPS[kind]
    return Chip(device.device_kind, spec.hbm_bytes, spec.hbm_bandwidth, spec.link_bandwidth)
