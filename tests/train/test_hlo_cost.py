"""Per-device work read from compiled HLO (``jaxrl_llm/train/compile/hlo_cost.py``): loop trip
counts applied (a scanned layer counts L times, as its unrolled twin does), and the decode
loop's per-device FLOPs split over ``data`` (issue 30 item 4), on 8 forced CPU devices."""

import jax
import jax.numpy as jnp
import pytest

from jaxrl_llm import models
from jaxrl_llm.parallel.topology import Topology
from jaxrl_llm.train.compile.aot import compile_preset
from jaxrl_llm.train.compile.hlo_cost import hlo_cost

L, B, D = 5, 24, 40  # odd, distinct sizes


def _layer(h, w):
    return jnp.tanh(h @ w)


def scanned(x, ws):
    return jax.lax.scan(lambda h, w: (_layer(h, w), None), x, ws)[0].sum()


def unrolled(x, ws):
    h = x
    for i in range(L):
        h = _layer(h, ws[i])
    return h.sum()


def fori(x, ws):
    return jax.lax.fori_loop(0, L, lambda i, h: _layer(h, ws[i]), x).sum()


ARGS = (jax.ShapeDtypeStruct((B, D), jnp.float32), jax.ShapeDtypeStruct((L, D, D), jnp.float32))


def _cost(fn):
    compiled = jax.jit(fn).lower(*ARGS).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return hlo_cost(compiled.as_text()), cost


@pytest.mark.parametrize("loop", [scanned, fori], ids=["scan", "fori_loop"])
def test_loop_counts_its_trip_count_times(loop):
    looped, xla = _cost(loop)
    flat, _ = _cost(unrolled)
    # the unrolled twin: L matmuls [B, D] x [D, D], 2·B·D·D each
    assert flat.flops == flat.flops_once == 2 * B * D * D * L and flat.trip_counts == ()
    assert looped.trip_counts == (L,) and looped.unknown_loops == 0
    assert looped.flops == flat.flops
    # counted once per loop body, as XLA's cost analysis counts it: its flops (which add the
    # elementwise tanh and sum, B·D·L + ... at most) are the matmuls of one layer plus a little
    assert looped.flops_once == looped.flops / L
    assert looped.flops_once <= xla["flops"] <= looped.flops_once * 1.1
    # HBM bytes scale by the loop too (the body's traffic L times, the rest once) and count
    # once per body they are XLA's "bytes accessed" (within 10%: our count reads a fusion
    # operand once per fusion)
    assert looped.hbm_bytes > 0.8 * L * (looped.hbm_bytes_once - 2 * B * D * 4)
    assert looped.hbm_bytes_once == pytest.approx(xla["bytes accessed"], rel=0.1)


def test_gradient_of_a_scan_counts_both_loops():
    looped, _ = _cost(jax.grad(scanned, argnums=1))
    flat, _ = _cost(jax.grad(unrolled, argnums=1))
    # forward 2·B·D·D and backward 2 × that (input and weight gradients) per layer; unrolled,
    # XLA drops the first layer's input gradient (x is not differentiated), the scan's body
    # computes it every time
    assert looped.trip_counts == (L, L)
    assert looped.flops == 3 * 2 * B * D * D * L
    assert flat.flops == (3 * L - 1) * 2 * B * D * D


TINY = models.ModelConfig(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    num_layers=2,
    num_heads=3,
    num_kv_heads=1,
    head_dim=16,
)


def _decode(data: int):
    devices = tuple(jax.devices()[:data])
    # the compile path on CPU devices: a "slice" of `data` forced CPU devices
    cpu = Topology(
        name=f"cpu:{data}",
        generation="v5e",
        chips=data,
        devices=devices,
        hbm_bytes_per_device=2**34,
    )
    report = compile_preset(
        TINY, "grpo", cpu, data=data, batch_size=8, group_size=2, seq_len=48, prompt_len=16
    )
    return {p.name: p for p in report.programs}["decode"]


def test_decode_flops_per_device_split_over_data():
    assert len(jax.devices()) >= 8, "tests/conftest.py forces 8 CPU devices"
    one, eight = _decode(1), _decode(8)
    # 8 prompts x G=2 = 16 rows, 32 decode steps: each of 8 devices decodes 2 rows
    assert one.unknown_loops == eight.unknown_loops == 1  # the data-dependent while_loop
    assert 32 in one.trip_counts and 32 in eight.trip_counts
    assert eight.hlo_flops == pytest.approx(one.hlo_flops / 8, rel=0.02)
    # the model FLOPs: 2·N per generated token over the devices
    assert eight.model_flops == pytest.approx(one.model_flops / 8)
    assert one.hlo_flops == pytest.approx(one.model_flops, rel=0.5)
