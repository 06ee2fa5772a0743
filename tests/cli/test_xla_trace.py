"""tools/bench/xla_trace.py: per-operation self times of a jitted program, by phase and kind."""

import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "bench"))
from xla_trace import KINDS, PHASES, op_time_breakdown, self_times  # noqa: E402


def test_self_times_subtract_nested_events_on_the_same_thread():
    evs = [
        {"name": "while", "ts": 0.0, "dur": 100.0, "pid": 1, "tid": 1},
        {"name": "dot", "ts": 10.0, "dur": 30.0, "pid": 1, "tid": 1},
        {"name": "fusion", "ts": 50.0, "dur": 20.0, "pid": 1, "tid": 1},
        {"name": "dot", "ts": 5.0, "dur": 50.0, "pid": 1, "tid": 2},
    ]
    t = self_times(evs)
    assert abs(t["while"] - 50e-6) < 1e-12
    assert abs(t["dot"] - 80e-6) < 1e-12 and abs(t["fusion"] - 20e-6) < 1e-12


def test_breakdown_of_a_gradient_step_finds_forward_and_backward_matmuls():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    w1 = jax.random.normal(k[0], (256, 512))
    w2 = jax.random.normal(k[1], (512, 256))
    x = jax.random.normal(k[2], (512, 256))

    def step(w1, w2, x):
        def loss(ws):
            return jnp.mean(jnp.tanh(x @ ws[0]) @ ws[1])

        g = jax.grad(loss)((w1, w2))
        return w1 - 0.1 * g[0], w2 - 0.1 * g[1]

    f = jax.jit(step)
    jax.block_until_ready(f(w1, w2, x))
    r = op_time_breakdown(f, w1, w2, x)
    assert set(r["table"]) <= {(p, k) for p in PHASES for k in KINDS}
    assert r["table"].get(("forward", "matmul"), 0) > 0
    assert r["table"].get(("backward", "matmul"), 0) > 0
    assert abs(sum(r["table"].values()) - r["total_s"]) < 1e-9
    assert r["top"][0][1] == max(t for _, t, *_ in r["top"])
