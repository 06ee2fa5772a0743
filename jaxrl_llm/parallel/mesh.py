"""Device meshes with the named axes ("data", "fsdp", "expert", "context", "tensor").

A mesh is always passed explicitly; nothing here reads or sets a global mesh.

* ``data``   — pure data parallelism: parameters replicated, batch rows split.
* ``fsdp``   — fully sharded data parallelism (ZeRO-3, Rajbhandari et al. 2020,
  https://arxiv.org/abs/1910.02054): batch rows split *and* parameters / optimizer state
  sharded, gathered on use by XLA's SPMD partitioner.
* ``expert`` — expert parallelism for mixture-of-experts models: each device holds 1/E of
  every layer's experts (and their gradients and optimizer state); tokens are replicated over
  this axis and each device runs its own experts on them, the partial outputs summed
  (:mod:`jaxrl_llm.models.moe`; GShard, Lepikhin et al. 2020, https://arxiv.org/abs/2006.16668).
  Dense parameters are replicated over it, like ``data``. Size 1 (the default) changes nothing.
* ``context`` — context (sequence) parallelism: the tokens of each row split over devices,
  attention by ring attention over this axis (:mod:`jaxrl_llm.models.ring_attention`; Liu et al.
  2023, https://arxiv.org/abs/2310.01889). Size 1 (the default) changes nothing.
* ``tensor`` — tensor (model) parallelism over heads / MLP width / vocabulary
  (Megatron-LM, Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from jaxrl_llm.errors import ConfigError

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "expert", "context", "tensor")


def mesh_shape(
    num_devices: int,
    *,
    data: int = -1,
    fsdp: int = 1,
    tensor: int = 1,
    context: int = 1,
    expert: int = 1,
) -> tuple[int, ...]:
    """Resolve the axis sizes for ``num_devices``, in :data:`MESH_AXES` order
    (data, fsdp, expert, context, tensor); at most one size may be -1.

    Raises:
      ConfigError: a size is 0 or < -1, more than one is -1, or the product is not
        ``num_devices``.
    """
    sizes = {
        "data": int(data),
        "fsdp": int(fsdp),
        "expert": int(expert),
        "context": int(context),
        "tensor": int(tensor),
    }
    for name, s in sizes.items():
        if s == 0 or s < -1:
            raise ConfigError(f"mesh.{name}={s} is invalid; use a positive size or -1 (the rest)")
    free = [n for n, s in sizes.items() if s == -1]
    if len(free) > 1:
        raise ConfigError(
            f"mesh sizes {sizes}: only one of data/fsdp/expert/context/tensor may be -1"
        )
    fixed = math.prod(s for s in sizes.values() if s != -1)
    if free:
        if num_devices % fixed:
            raise ConfigError(
                f"mesh sizes {sizes}: {num_devices} devices are not divisible by "
                f"{fixed}; choose sizes whose product divides the device count"
            )
        sizes[free[0]] = num_devices // fixed
    if math.prod(sizes.values()) != num_devices:
        raise ConfigError(
            f"mesh sizes {sizes} multiply to {math.prod(sizes.values())} but there "
            f"are {num_devices} devices; make data*fsdp*expert*context*tensor equal the device count "
            f"(or set one to -1)"
        )
    return tuple(sizes[a] for a in MESH_AXES)


def make_mesh(
    *,
    data: int = -1,
    fsdp: int = 1,
    tensor: int = 1,
    context: int = 1,
    expert: int = 1,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A ``Mesh`` over ``devices`` (default: every device of every host) with axes
    ("data", "fsdp", "expert", "context", "tensor").

    The tensor axis is innermost (neighbouring devices, fastest links), context next to it
    (ring attention passes K/V blocks between neighbours every step), then expert (one
    all-reduce per MoE layer), data outermost (across hosts on multi-host runs), the usual
    layout for TPU pods and GPU nodes.

    Args:
      data, fsdp, tensor, context, expert: axis sizes; one of them may be -1 for "the
        remaining devices".
      devices: the devices to use (e.g. ``jax.devices()[:4]``); default ``jax.devices()``.

    Returns:
      A ``jax.sharding.Mesh`` with Auto axis types (GSPMD propagation).

    Raises:
      ConfigError: when the sizes do not multiply to the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(
        len(devices), data=data, fsdp=fsdp, tensor=tensor, context=context, expert=expert
    )
    auto = (AxisType.Auto,) * len(MESH_AXES)
    if len(devices) == jax.device_count() and devices == list(jax.devices()):
        # Let JAX pick a topology-aware device order (ICI rings on TPU, hosts outermost).
        return jax.make_mesh(shape, MESH_AXES, axis_types=auto)
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES, axis_types=auto)


def split_devices(rollout_devices: int, devices: list | None = None) -> tuple[list, list]:
    """``(learner devices, rollout devices)``: the last ``rollout_devices`` of ``devices``
    (default: every device) sample, the rest learn; ``(all, [])`` when 0.

    Raises:
      ConfigError: ``rollout_devices`` leaves the learner no device, or the run spans
        several processes.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = int(rollout_devices)
    if n == 0:
        return devices, []
    if n < 0 or n >= len(devices):
        raise ConfigError(
            f"rollout.devices={n}: the rollout mesh takes the last n of the {len(devices)} "
            f"devices and the learner the rest; use 1..{len(devices) - 1} (0 = colocated)"
        )
    if jax.process_count() > 1:
        raise ConfigError(
            "rollout.devices > 0 (a separate rollout mesh) runs in one process only; "
            "use rollout.devices: 0 on multi-host runs"
        )
    return devices[:-n], devices[-n:]


def free_memory(device=None) -> int:
    """Bytes ``device`` can still hold: an accelerator's ``bytes_limit − bytes_in_use`` (its
    ``memory_stats()``); on the CPU, or where a runtime gives no statistics, this machine's
    ``MemAvailable`` (total physical memory where there is no ``/proc/meminfo``)."""
    stats = None
    if device is not None and device.platform != "cpu":
        try:
            stats = device.memory_stats()
        except Exception:  # noqa: BLE001 - runtimes without statistics raise, or return None
            stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    import os

    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
