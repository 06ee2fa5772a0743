"""Host-side step timing and model-FLOPs utilisation (MFU).

MFU (PaLM, Chowdhery et al. 2022, https://arxiv.org/abs/2204.02311, App. B): the training
FLOPs a dense decoder needs per token are ≈ 6·N (2·N forward, 4·N backward, N parameters,
attention FLOPs ignored), so MFU = 6 · N · tokens / (step time · peak FLOP/s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp


def mfu(*, num_params: int, tokens: float, seconds: float, peak_flops: float) -> float:
    """6 · num_params · tokens / seconds / peak_flops (a fraction, 1.0 = peak).

    Args:
      num_params: N, model parameters.
      tokens: tokens processed in ``seconds`` (forward + backward).
      seconds: wall-clock time of the step(s).
      peak_flops: peak FLOP/s of all devices the step ran on together.
    """
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"seconds={seconds} and peak_flops={peak_flops} must be positive")
    return 6.0 * num_params * tokens / seconds / peak_flops


def measure_matmul_flops(
    *, n: int = 1024, dtype: Any = jnp.float32, repeats: int = 5, device: jax.Device | None = None
) -> float:
    """Measured FLOP/s of one device on an ``n × n`` by ``n × n`` jitted matmul (2·n³ FLOPs),
    best of ``repeats`` after a warm-up: a practical "peak" where no datasheet number applies
    (e.g. CPUs)."""
    device = device or jax.local_devices()[0]
    a = jax.device_put(jnp.ones((n, n), dtype), device)
    b = jax.device_put(jnp.ones((n, n), dtype), device)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def timed_step(
    step: Callable,
    state: Any,
    batch: Mapping[str, Any],
    frozen: Mapping[str, Any] | None = None,
    *,
    num_params: int | None = None,
    peak_flops: float | None = None,
) -> tuple[Any, dict[str, float]]:
    """Run one step, wait for it, and add host-side throughput metrics.

    Returns:
      ``(new_state, metrics)`` with metrics as Python floats plus ``step_time_s``,
      ``tokens_per_s`` and, when ``num_params`` and ``peak_flops`` are given, ``mfu``.
    """
    t0 = time.perf_counter()
    state, metrics = step(state, batch, frozen)
    metrics = jax.block_until_ready(metrics)
    seconds = time.perf_counter() - t0
    out = {k: float(v) for k, v in jax.device_get(metrics).items()}
    out["step_time_s"] = seconds
    out["tokens_per_s"] = out.get("tokens", 0.0) / seconds
    if num_params is not None and peak_flops is not None:
        out["mfu"] = mfu(
            num_params=num_params,
            tokens=out.get("tokens", 0.0),
            seconds=seconds,
            peak_flops=peak_flops,
        )
    return state, out
