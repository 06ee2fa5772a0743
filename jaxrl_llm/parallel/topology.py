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

GiB = 1024**3

#: HBM per chip (bytes) by TPU generation, the prefix of a topology name.
TPU_HBM_BYTES: dict[str, int] = {
    "v4": 32 * GiB,
    "v5e": 16 * GiB,
    "v5p": 95 * GiB,
    "v6e": 32 * GiB,
}

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
    """

    name: str
    generation: str
    chips: int
    devices: tuple
    hbm_bytes_per_device: int

    @property
    def num_devices(self) -> int:
        """How many devices a mesh over this slice has."""
        return len(self.devices)


def libtpu_available() -> bool:
    """Whether the TPU compiler (``libtpu``) can be imported in this environment."""
    return importlib.util.find_spec("libtpu") is not None


def parse_topology_name(name: str) -> tuple[str, tuple[int, ...]]:
    """``"v5p:2x2x2"`` -> ``("v5p", (2, 2, 2))``; ConfigError naming the allowed forms."""
    m = _NAME.match(name.strip())
    if not m:
        raise ConfigError(
            f"--topology {name!r}: expected GENERATION:GRID such as v5e:2x2, "
            f"v5p:2x2x2 or v6e:2x4 (generations: {', '.join(TPU_HBM_BYTES)})"
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
    return Topology(
        name=name.strip(),
        generation=gen,
        chips=chips,
        devices=devices,
        hbm_bytes_per_device=TPU_HBM_BYTES[gen] // per_chip,
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
