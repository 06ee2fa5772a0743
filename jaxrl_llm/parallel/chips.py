"""The one table of accelerator chips: HBM bytes and bandwidth, interconnect bandwidth and bf16
peak of each device kind a run may plan for or find itself on (issue 51: one chip table).

Keys are the kinds ``jaxrl-llm memory --device`` takes (``tpu-v5p``, ``h100``). The TPU
generations' numbers and their sources are in :mod:`jaxrl_llm.parallel.topology`'s docstring
(Google Cloud's TPU pages); its ``TPU_*`` tables are read from this one. NVIDIA's from the H100
SXM, H200 and A100 80GB SXM datasheets: HBM 80 / 141 / 80 GB, HBM bandwidth 3.35 / 4.8 / 2.039
TB/s, NVLink 900 / 900 / 600 GB/s, dense bf16 989 / 989 / 312 TFLOP/s.

HBM sizes are binary (GiB), on TPUs and GPUs alike: Google's pages say GiB; NVIDIA's "80GB" is
five 16 GiB HBM3 stacks, and ``nvidia-smi`` reports 81559 MiB (85.5e9 B, after a reserve) on an
H100 80GB HBM3 and 81920 MiB on an A100 80GB (NVIDIA/nccl issue 1264, modal-labs/modal-client
pull 2797). Read as 80e9 B, an H100 would be 6.5% smaller than the device says it is; the
H200 this project's device checks use is described as "about 139 GiB" usable, more than
141e9 B (131 GiB). The decode model (:mod:`jaxrl_llm.parallel.decode_model`) read 80e9 / 141e9 B
before this table; the memory estimator read 80 / 141 GiB, and still does.
"""

from __future__ import annotations

import dataclasses

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    """One device kind's datasheet numbers. ``link_bandwidth``: the interconnect's bytes/s per
    chip as the datasheet gives it (None: not given). ``device_kinds``: lower-case substrings of
    JAX's ``device.device_kind`` that name it (most specific first across the table)."""

    hbm_bytes: int
    hbm_bandwidth: float
    link_bandwidth: float | None
    peak_bf16_flops: float
    device_kinds: tuple[str, ...]


#: Device kind -> its numbers (module docstring for the sources). The TPU bandwidths marked
#: UNSURE in :mod:`jaxrl_llm.parallel.topology` stay so.
CHIPS: dict[str, ChipSpec] = {
    "tpu-v4": ChipSpec(32 * GiB, 1200e9, None, 275e12, ("v4",)),
    "tpu-v5e": ChipSpec(16 * GiB, 819e9, 400e9, 197e12, ("v5 lite", "v5e")),
    "tpu-v5p": ChipSpec(95 * GiB, 2765e9, 1200e9, 459e12, ("v5p", "v5")),
    "tpu-v6e": ChipSpec(32 * GiB, 1640e9, 800e9, 918e12, ("v6 lite", "v6e", "v6")),
    "h100": ChipSpec(80 * GiB, 3.35e12, 900e9, 989e12, ("h100",)),
    "h200": ChipSpec(141 * GiB, 4.8e12, 900e9, 989e12, ("h200",)),
    "a100": ChipSpec(80 * GiB, 2.039e12, 600e9, 312e12, ("a100",)),
}


def chip_kind(device_kind: str) -> str | None:
    """The :data:`CHIPS` key of a JAX ``device_kind`` (``"TPU v5 lite"`` -> ``"tpu-v5e"``,
    ``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``), or None for one not in the table. The most
    specific substring wins (``v5 lite`` before ``v5``)."""
    low = device_kind.lower()
    matches = [
        (len(sub), kind) for kind, c in CHIPS.items() for sub in c.device_kinds if sub in low
    ]
    return max(matches)[1] if matches else None


def tpu_generation(kind: str) -> str:
    """``tpu-v5p`` -> ``v5p``: the prefix of a TPU topology name."""
    return kind.removeprefix("tpu-")
