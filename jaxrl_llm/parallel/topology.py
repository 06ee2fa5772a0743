"""Abstract TPU devices for compiling ahead of time on a machine without a TPU.

With ``libtpu`` installed, :func:`jax.experimental.topologies.get_topology_desc` describes a
TPU slice (``"v5p:2x2x2"``: generation, then the chip grid) as devices that exist only for the
compiler. A mesh over them lowers and compiles a sharded program exactly as on the slice, so
its per-device memory (``compiled.memory_analysis()``) and FLOPs (``compiled.cost_analysis()``)
are known before any TPU is rented. MaxText's ``train_compile.py`` works the same way.

HBM per chip, from Google Cloud's TPU pages
(https://cloud.google.com/tpu/docs/system-architecture-tpu-vm):
v4 32 GiB, v5e 16 GiB, v5p 95 GiB, v6e (Trillium) 32 GiB. A chip with two TensorCores that
the runtime shows as two devices (v4 without megacore) gives each device half.

Peak bf16 FLOP/s, HBM bandwidth and inter-chip interconnect (ICI) bandwidth per chip, for the
roofline of ``jaxrl-llm compile`` (:mod:`jaxrl_llm.train.compile.hlo_cost`), from the
"System architecture" table of each generation's Google Cloud TPU page
(https://cloud.google.com/tpu/docs/v4, https://cloud.google.com/tpu/docs/v5e,
https://cloud.google.com/tpu/docs/v5p, https://cloud.google.com/tpu/docs/v6e), read
2026-11-26:

* v4: 275 TFLOP/s, 1200 GB/s HBM. ICI: not given as a per-chip number on that page; left
  unknown (None), so a v4 roofline has no collective term.
* v5e: 197 TFLOP/s; HBM 819 GB/s (an older version of the page; the current one says
  "800 GiBps", 859 GB/s: UNSURE which, the lower is used); ICI 400 GB/s bidirectional per
  chip (the current page; an older one gives "1600 Gbps" = 200 GB/s, likely one way).
* v5p: 459 TFLOP/s; HBM 2765 GB/s (= the current page's "2575 GiBps"); ICI 1200 GB/s
  bidirectional per chip (the current page; older versions give "4800 Gbps" = 600 GB/s,
  likely one way).
* v6e: 918 TFLOP/s; HBM 1640 GB/s (one version of the page says 1600: UNSURE, the higher
  is used); ICI 800 GB/s bidirectional per chip (the current page; older versions give
  "3584 Gbps" = 448 GB/s and "3200 Gbps" = 400 GB/s: UNSURE).

The bidirectional ICI number is every link of a chip busy both ways at once: a roofline
that divides the bytes a device sends by it is a lower bound on the time of its
collectives.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from collections.abc import Sequence

import jax

from jaxrl_llm.errors import ConfigError, JaxrlError
from jaxrl_llm.parallel.chips import CHIPS, tpu_generation

_TPUS = {tpu_generation(k): c for k, c in CHIPS.items() if k.startswith("tpu-")}

#: HBM per chip (bytes) by TPU generation, the prefix of a topology name (from
#: :data:`jaxrl_llm.parallel.chips.CHIPS`, the one chip table; sources: this module's docstring).
TPU_HBM_BYTES: dict[str, int] = {g: c.hbm_bytes for g, c in _TPUS.items()}

#: Peak dense bf16 FLOP/s per chip.
TPU_PEAK_BF16_FLOPS: dict[str, float] = {g: c.peak_bf16_flops for g, c in _TPUS.items()}

#: HBM bandwidth per chip, bytes/s (module docstring: v5e's and v6e's are UNSURE).
TPU_HBM_BANDWIDTH: dict[str, float] = {g: c.hbm_bandwidth for g, c in _TPUS.items()}

#: Bidirectional ICI bandwidth per chip, bytes/s; None: not on the datasheet (v4). v6e's is
#: UNSURE (module docstring).
TPU_ICI_BANDWIDTH: dict[str, float | None] = {g: c.link_bandwidth for g, c in _TPUS.items()}

#: How to get the TPU compiler when it is missing (one line, shown by the CLI).
LIBTPU_HINT = (
    f'install the TPU compiler: pip install "jax[tpu]=={jax.__version__}" '
    f'(or: pip install "jaxrl_llm[tpu-compile]")'
)

_NAME = re.compile(r"^(v\d+[a-z]*):(\d+(?:x\d+)*)$")


class LibtpuMissingError(JaxrlError, RuntimeError):
    """The TPU compiler (the ``libtpu`` package) is not installed."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU slice described for the compiler.

    Attributes:
      name: e.g. ``"v5p:2x2x2"``. generation: ``"v5p"``. chips: chips in the slice.
      devices: the abstract devices (one per TensorCore group the runtime exposes).
      hbm_bytes_per_device: HBM each device owns.
      peak_flops_per_device, hbm_bandwidth_per_device, ici_bandwidth_per_device: the chip's
        datasheet numbers (FLOP/s, bytes/s; module docstring) shared by its devices; ICI
        None where the datasheet gives none.
    """

    name: str
    generation: str
    chips: int
    devices: tuple
    hbm_bytes_per_device: int
    peak_flops_per_device: float = 0.0
    hbm_bandwidth_per_device: float = 0.0
    ici_bandwidth_per_device: float | None = None

    @property
    def num_devices(self) -> int:
        """How many devices a mesh over this slice has."""
        return len(self.devices)


def libtpu_available() -> bool:
    """Whether the TPU compiler (``libtpu``) can be imported in this environment."""
    return importlib.util.find_spec("libtpu") is not None


# gcloud's accelerator types: v4-N and v5p-N count TensorCores (2 per chip), v5e / v5litepod-N
# and v6e-N count chips; the grids the slices of those sizes have (Google Cloud's TPU
# "versions" pages, read 2026-11-28)
_GCLOUD = re.compile(r"^(v4|v5p|v5e|v5litepod|v6e)-(\d+)$")
_GRIDS_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8"}
_GRIDS_2D = {
    1: "1x1",
    4: "2x2",
    8: "2x4",
    16: "4x4",
    32: "4x8",
    64: "8x8",
    128: "8x16",
    256: "16x16",
}


def gcloud_topology_name(name: str) -> str:
    """Gcloud's ``v5p-8`` / ``v6e-8`` / ``v5litepod-16`` as ``GENERATION:GRID``
    (``v5p:2x2x1``, ``v6e:2x4``, ``v5e:4x4``); other names unchanged."""
    m = _GCLOUD.match(name.strip())
    if not m:
        return name
    gen, n = m.group(1), int(m.group(2))
    gen = "v5e" if gen == "v5litepod" else gen
    chips = n // 2 if gen in ("v4", "v5p") else n
    grid = (_GRIDS_3D if gen in ("v4", "v5p") else _GRIDS_2D).get(chips)
    if grid is None:
        raise ConfigError(f"--topology {name!r}: no slice of {chips} chips known for {gen}")
    return f"{gen}:{grid}"


def parse_topology_name(name: str) -> tuple[str, tuple[int, ...]]:
    """``"v5p:2x2x2"`` (or gcloud's ``"v5p-16"``) -> ``("v5p", (2, 2, 2))``; ConfigError
    naming the allowed forms."""
    m = _NAME.match(gcloud_topology_name(name.strip()))
    if not m:
        raise ConfigError(
            f"--topology {name!r}: expected GENERATION:GRID such as v5e:2x2, "
            f"v5p:2x2x2 or v6e:2x4, or gcloud's v5p-16 / v6e-8 (generations: "
            f"{', '.join(TPU_HBM_BYTES)})"
        )
    gen, grid = m.group(1), tuple(int(x) for x in m.group(2).split("x"))
    if gen not in TPU_HBM_BYTES:
        raise ConfigError(
            f"--topology {name!r}: unknown TPU generation {gen!r}; known: "
            f"{', '.join(TPU_HBM_BYTES)}"
        )
    if min(grid) < 1:
        raise ConfigError(f"--topology {name!r}: grid sizes must be >= 1")
    return gen, grid


def tpu_topology(name: str) -> Topology:
    """The abstract devices of a TPU slice, for compiling without one.

    Args:
      name: ``GENERATION:GRID``, e.g. ``"v5e:2x2"`` (4 chips), ``"v5p:4x4x4"`` (64 chips).

    Returns:
      A :class:`Topology`.

    Raises:
      LibtpuMissingError: ``libtpu`` is not installed (the message says how to install it).
      ConfigError: the name is malformed or the compiler rejects the grid.
    """
    gen, grid = parse_topology_name(name)
    name = gcloud_topology_name(name.strip())
    if not libtpu_available():
        raise LibtpuMissingError(
            f"--topology {name}: the TPU compiler is not installed; {LIBTPU_HINT}"
        )
    # Compiling takes no TPU: let several processes (parallel benchmarks, tests) load libtpu,
    # which otherwise takes a host-wide lock file on first use.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    try:
        desc = topologies.get_topology_desc(topology_name=name.strip(), platform="tpu")
    except Exception as e:  # the compiler's own message names the problem
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"--topology {name!r}: the TPU compiler rejected it ({first})") from None
    devices = tuple(desc.devices)
    chips = math.prod(grid)
    per_chip = max(len(devices) // chips, 1)
    ici = TPU_ICI_BANDWIDTH[gen]
    return Topology(
        name=name.strip(),
        generation=gen,
        chips=chips,
        devices=devices,
        hbm_bytes_per_device=TPU_HBM_BYTES[gen] // per_chip,
        peak_flops_per_device=TPU_PEAK_BF16_FLOPS[gen] / per_chip,
        hbm_bandwidth_per_device=TPU_HBM_BANDWIDTH[gen] / per_chip,
        ici_bandwidth_per_device=None if ici is None else ici / per_chip,
    )


def first_devices(topology: Topology, n: int) -> Topology:
    """The first ``n`` devices of a slice as a slice of their own (``jaxrl-llm compile
    --devices``): one device of a v5p slice, whose smallest topology is 2x2x1, to compare a
    program on one chip with the same program split over the slice.

    Raises:
      ConfigError: ``n`` is not in [1, the slice's devices].
    """
    if not 1 <= n <= topology.num_devices:
        raise ConfigError(
            f"--devices {n}: the slice {topology.name} has {topology.num_devices} devices"
        )
    per_chip = max(topology.num_devices // topology.chips, 1)
    return dataclasses.replace(
        topology,
        name=f"{topology.name}[:{n}]",
        chips=-(-n // per_chip),
        devices=topology.devices[:n],
    )


def topology_mesh(
    topology: Topology,
    *,
    data: int = -1,
    fsdp: int = 1,
    tensor: int = 1,
    context: int = 1,
    expert: int = 1,
    devices: Sequence | None = None,
):
    """A ("data", "fsdp", "expert", "context", "tensor") mesh over a topology's abstract
    devices (:func:`jaxrl_llm.parallel.make_mesh` with those devices)."""
    from jaxrl_llm.parallel.mesh import make_mesh

    return make_mesh(
        data=data,
        fsdp=fsdp,
        tensor=tensor,
        context=context,
        expert=expert,
        devices=list(topology.devices if devices is None else devices),
    )
