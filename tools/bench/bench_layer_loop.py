"""Benchmark: how a decode step's layer loop reads stacked weights, four ways.

A decode step is memory-bound: each token step should read every weight once. The model keeps
its layers stacked (``[L, ...]`` leaves) and runs them under ``lax.scan``; on GPU, XLA copies
each layer's slice out of the stack before its matmuls (an async ``dynamic-slice`` per weight,
seen in the optimized HLO of ``sampling.decode._decode`` on an H200), so the weights cross
memory three times. This measures the same MLP-shaped layer stack (``rms(x + gelu(x·U)·D)``) inside
a ``fori_loop`` of token steps, as:

* ``scan``: ``lax.scan`` over the stacked weights (what the model does);
* ``scan unrolled``: the same scan with ``unroll=True`` (constant slice indices);
* ``static slices``: a Python loop over ``w[i]`` of the stacked weights;
* ``separate arrays``: a Python loop over L separate weight arrays (no slicing at all).

Reports ms per token step and the bytes of weights per step over that time (GB/s), against
the datasheet bandwidth where the device is in ``common.DATASHEETS``.

    python tools/bench/bench_layer_loop.py --out /tmp/layer_loop.md               # CPU sizes
    python tools/bench/bench_layer_loop.py --layers 32 --hidden 4096 --ffn 14336 --rows 64
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--rows", type=int, default=16, help="decode rows (the matmuls' M)")
    p.add_argument("--steps", type=int, default=8, help="token steps per call")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(args.dtype)
    k_up, k_down, k_x = jax.random.split(jax.random.PRNGKey(0), 3)
    shape_up = (args.layers, args.hidden, args.ffn)
    shape_down = (args.layers, args.ffn, args.hidden)
    up = (jax.random.normal(k_up, shape_up, jnp.float32) * 0.02).astype(dtype)
    down = (jax.random.normal(k_down, shape_down, jnp.float32) * 0.02).astype(dtype)
    x0 = jax.random.normal(k_x, (args.rows, args.hidden), jnp.float32).astype(dtype)
    ups = [up[i] for i in range(args.layers)]
    downs = [down[i] for i in range(args.layers)]
    jax.block_until_ready((ups, downs))

    def layer(x, u, d):  # RMS-normalised so 16 steps × 32 layers stay finite in bf16
        y = x + jax.nn.gelu(x @ u) @ d
        y32 = y.astype(jnp.float32)
        return (y32 * jax.lax.rsqrt(jnp.mean(y32 * y32, -1, keepdims=True) + 1e-6)).astype(dtype)

    def over_steps(one_step):
        return lambda x, *w: jax.lax.fori_loop(0, args.steps, lambda _, x: one_step(x, *w), x)

    def scan_step(x, up, down, unroll=False):
        return jax.lax.scan(lambda x, w: (layer(x, *w), None), x, (up, down), unroll=unroll)[0]

    def static_step(x, up, down):
        for i in range(args.layers):
            x = layer(x, up[i], down[i])
        return x

    def separate_step(x, ups, downs):
        for u, d in zip(ups, downs, strict=True):
            x = layer(x, u, d)
        return x

    variants = {
        "scan": (over_steps(scan_step), (up, down)),
        "scan unrolled": (over_steps(functools.partial(scan_step, unroll=True)), (up, down)),
        "static slices": (over_steps(static_step), (up, down)),
        "separate arrays": (over_steps(separate_step), (ups, downs)),
    }
    weight_bytes = 2 * args.layers * args.hidden * args.ffn * dtype.itemsize
    sheet = common.datasheet()
    rows, metrics, ref = [], {}, None
    for name, (fn, weights) in variants.items():
        f = jax.jit(fn)
        first = common.timed_first_call(lambda f=f, w=weights: f(x0, *w).block_until_ready())
        t = common.best_time(lambda f=f, w=weights: f(x0, *w).block_until_ready(), args.repeats)
        out = f(x0, *weights)
        ref = out if ref is None else ref
        step_s = t / args.steps
        gbs = weight_bytes / step_s / 1e9
        err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
        note = f"first call {first:.1f}s incl. compile; max |Δ| vs scan {err:.2g}"
        if sheet is not None:
            note += f"; {100 * gbs * 1e9 / sheet[1]:.0f}% of the datasheet bandwidth"
        rows.append([name, f"{1e3 * step_s:.3f}", f"{gbs:,.0f}", note])
        metrics[name.replace(" ", "_") + "_ms_per_step"] = 1e3 * step_s
        common.log(rows[-1])
    body = [
        f"{args.layers} layers of x + gelu(x·U)·D, hidden {args.hidden}, ffn {args.ffn}, "
        f"{args.rows} rows, {args.dtype}: {weight_bytes / 1e9:.2f} GB of weights read per token "
        f"step; {args.steps} token steps per call (a fori_loop), best of {args.repeats}.",
        "",
        *common.markdown_table(
            ["layer loop", "ms per token step", "weight GB/s", "note"], rows, align="lrrl"
        ),
    ]
    return common.report(
        args.out,
        __file__,
        argv,
        title="Layer loop: how a decode step reads stacked weights",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
