"""Where the time of a policy-gradient train step goes (the train-step benchmark's profile).

Same model, batch and loss as ``bench_train_step.py`` (token-level PG loss, AdamW, float32).
Times, each as the median of ``--steps`` runs after a warm-up, in one process:

* the jitted forward loss, forward + backward (``value_and_grad``), and the full train step
  (forward + backward + AdamW, the sharded ``make_train_step``) — the differences give the
  backward and optimizer shares;
* the step's dense matmuls alone at the model's real shapes (every layer's q/k/v/o and MLP
  projections and the unembedding, ×3 for forward, input-gradient and weight-gradient), run as
  one jitted program: the floor a perfectly fused step could reach on this backend;
* XLA's own cost analysis of the compiled step (FLOPs and bytes accessed), to show how far the
  non-matmul work (attention softmax, norms, RoPE, elementwise, log-softmax) and memory traffic
  go beyond the 6·N·T estimate;
* one step under ``jax.profiler`` (``xla_trace.py``): the self time of every XLA operation of
  the compiled step, by phase (forward / backward / optimizer and the rest) and kind (matmul,
  elementwise / reduce, copy / layout, control flow), and the operations that take longest;
* the step without its parts (one jitted ``value_and_grad`` + AdamW; ``make_train_step``
  without the NaN/Inf guard), to show what the step adds to ``value_and_grad``.

Full run:    python tools/bench/profile_train_step.py --out tools/bench/results/train_profile.md
Smoke test:  python tools/bench/profile_train_step.py --model tiny --steps 1 --out /tmp/p.md
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm.models import init_params, param_logical_axes
from jaxrl_llm.parallel import batch_sharding, make_mesh
from jaxrl_llm.train import create_train_state, make_train_step

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_train_step import make_batch, pg_loss  # noqa: E402
from xla_trace import KINDS, PHASES, op_time_breakdown  # noqa: E402


def _median_time(fn, steps: int) -> float:
    jax.block_until_ready(fn())  # warm-up (compiles)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def matmul_only_program(cfg, tokens: int):
    """A jitted program doing exactly the step's dense matmuls (fwd, dX, dW per weight) at the
    model's shapes, scanned over layers like the model; returns (fn, flops)."""
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hq, hk = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = [(d, hq), (d, hk), (d, hk), (hq, d), (d, f), (d, f), (f, d)]
    key = jax.random.PRNGKey(0)
    ws = [jax.random.normal(key, (cfg.num_layers, a, b), jnp.float32) * 0.01 for a, b in shapes]
    unembed = jax.random.normal(key, (d, v), jnp.float32) * 0.01
    xs = {a: jax.random.normal(key, (tokens, a), jnp.float32) for a in {d, f, hq}}

    @jax.jit
    def run(ws, unembed, xs):
        def layer(acc, w_layer):
            out = acc
            for (a, _b), w in zip(shapes, w_layer):
                x = xs[a]
                y = x @ w  # forward
                dx = y @ w.T  # input gradient
                dw = x.T @ y  # weight gradient
                out = out + jnp.sum(dx[:1, :1]) + jnp.sum(dw[:1, :1])
            return out, None

        acc, _ = jax.lax.scan(layer, jnp.zeros(()), ws)
        logits = xs[d] @ unembed
        return acc + jnp.sum((logits @ unembed.T)[:1, :1]) + jnp.sum((xs[d].T @ logits)[:1, :1])

    flops_layer = sum(2 * tokens * a * b for a, b in shapes) * 3
    flops = cfg.num_layers * flops_layer + 3 * 2 * tokens * d * v
    return (lambda: run(ws, unembed, xs)), flops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=common.DEFAULT_MODEL)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    cfg = common.model_config(args.model)
    batch = make_batch(0, args.batch, args.seq, cfg.vocab_size)
    tokens = args.batch * args.seq
    n_params = cfg.num_params()
    loss = functools.partial(pg_loss, config=cfg)

    opt = optax.adamw(1e-5)
    mesh = make_mesh(data=-1)
    state, sharding = create_train_state(
        functools.partial(init_params, cfg),
        opt,
        mesh,
        param_axes=param_logical_axes(cfg),
        rng=jax.random.PRNGKey(0),
    )
    step = make_train_step(
        loss, opt, mesh=mesh, state_sharding=sharding, batch_sharding=batch_sharding(mesh)
    )
    params = state.params
    jbatch = jax.device_put({k: jnp.asarray(x) for k, x in batch.items()}, batch_sharding(mesh))

    fwd = jax.jit(lambda prm, b: loss(prm, b)[0])
    grad = jax.jit(jax.value_and_grad(lambda prm, b: loss(prm, b)[0]))
    common.log("timing forward / forward+backward / step ...")
    t_fwd = _median_time(lambda: fwd(params, jbatch), args.steps)
    t_grad = _median_time(lambda: grad(params, jbatch), args.steps)

    holder = {"state": state}

    def run_step():
        holder["state"], m = step(holder["state"], batch)
        return m

    # Copies for the runs below: the step donates (deletes) the state it is given.
    fh = {"p": jax.tree.map(jnp.copy, params), "s": jax.tree.map(jnp.copy, state.opt_state)}
    t_step = _median_time(run_step, args.steps)

    common.log("timing the step without its parts ...")

    def fused(prm, opt_state, b):
        value, grads = jax.value_and_grad(lambda q: loss(q, b)[0])(prm)
        updates, opt_state = opt.update(grads, opt_state, prm)
        return optax.apply_updates(prm, updates), opt_state, value

    fused_j = jax.jit(fused, donate_argnums=(0, 1))

    def run_fused():
        fh["p"], fh["s"], value = fused_j(fh["p"], fh["s"], jbatch)
        return value

    t_fused = _median_time(run_fused, args.steps)
    fh.clear()  # free the copies
    unguarded = make_train_step(
        loss,
        opt,
        mesh=mesh,
        state_sharding=sharding,
        batch_sharding=batch_sharding(mesh),
        skip_nonfinite=False,
    )
    uh = {"state": jax.tree.map(jnp.copy, holder["state"])}

    def run_unguarded():
        uh["state"], m = unguarded(uh["state"], jbatch)
        return m

    t_unguarded = _median_time(run_unguarded, args.steps)
    uh.clear()

    common.log("one step under the profiler ...")
    trace = None
    try:
        trace = op_time_breakdown(step.jitted, holder["state"], jbatch, {}, {})
    except Exception as e:  # the profiler's per-op events are backend-dependent
        common.log(f"per-operation trace unavailable: {e}")
    common.log("timing the matmul-only program ...")
    mm_fn, mm_flops = matmul_only_program(cfg, tokens)
    t_mm = _median_time(mm_fn, args.steps)
    rate_sq = common.matmul_rate(1024, 1024, 1024)

    cost = {}
    try:
        compiled = grad.lower(params, jbatch).compile()
        ca = compiled.cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        cost = {"flops": float(ca.get("flops", 0.0)), "bytes": float(ca.get("bytes accessed", 0.0))}
    except Exception as e:  # cost analysis is backend-dependent; the table says so
        common.log(f"cost analysis unavailable: {e}")

    est = 6 * n_params * tokens
    rows = [
        ["forward (loss only)", f"{t_fwd:.3f}", f"{100 * t_fwd / t_step:.0f}%"],
        [
            "backward (value_and_grad − forward)",
            f"{t_grad - t_fwd:.3f}",
            f"{100 * (t_grad - t_fwd) / t_step:.0f}%",
        ],
        [
            "optimizer + step overhead (step − value_and_grad)",
            f"{t_step - t_grad:.3f}",
            f"{100 * (t_step - t_grad) / t_step:.0f}%",
        ],
        ["**whole train step**", f"**{t_step:.3f}**", "100%"],
        [
            "value_and_grad + AdamW in one jit (no sharding annotations, no guard)",
            f"{t_fused:.3f}",
            f"{100 * t_fused / t_step:.0f}%",
        ],
        [
            "the train step without the NaN/Inf guard",
            f"{t_unguarded:.3f}",
            f"{100 * t_unguarded / t_step:.0f}%",
        ],
        [
            "the step's dense matmuls alone (same shapes)",
            f"{t_mm:.3f}",
            f"{100 * t_mm / t_step:.0f}%",
        ],
    ]
    body = [
        f"Model: {common.fmt_params(n_params)} params; batch {args.batch} × {args.seq} = "
        f"{tokens} tokens; median of {args.steps} after a warm-up; "
        f"{len(jax.devices())} device(s).",
        "",
        *common.markdown_table(["part", "time (s)", "share of the step"], rows, align="lrr"),
        "",
        f"Dense-matmul FLOPs of the step: {mm_flops / 1e12:.3f} TFLOP (6·N·T estimate: "
        f"{est / 1e12:.3f}); at the model's shapes they run at {mm_flops / t_mm / 1e9:.1f} "
        f"GFLOP/s, against {rate_sq / 1e9:.1f} GFLOP/s for a 1024² square matmul.",
    ]
    metrics = {
        "forward_s": t_fwd,
        "value_and_grad_s": t_grad,
        "step_s": t_step,
        "fused_value_and_grad_adamw_s": t_fused,
        "step_unguarded_s": t_unguarded,
        "matmul_only_s": t_mm,
        "matmul_only_flops": mm_flops,
        "matmul_rate_model_shapes": mm_flops / t_mm,
        "matmul_rate_square": rate_sq,
    }
    if cost:
        body.append(
            f"XLA cost analysis of forward + backward: {cost['flops'] / 1e12:.3f} TFLOP, "
            f"{cost['bytes'] / 2**30:.2f} GiB accessed."
        )
        metrics.update(xla_flops=cost["flops"], xla_bytes=cost["bytes"])
    body += [
        "",
        "Reading: the matmul-only row is what the step would cost if everything but "
        "the dense matmuls were free; the gap between it and the whole step is attention, "
        "normalisation, elementwise and log-softmax work plus memory traffic, and the gap "
        "between the two matmul rates is the cost of the model's thin shapes on this "
        "backend.",
    ]
    if trace is not None:
        tot = trace["total_s"]
        cells = [
            [ph]
            + [f"{trace['table'].get((ph, k), 0.0):.3f}" for k in KINDS]
            + [f"{sum(trace['table'].get((ph, k), 0.0) for k in KINDS):.3f}"]
            for ph in PHASES
        ]
        cells.append(
            ["**all**"]
            + [f"{sum(trace['table'].get((ph, k), 0.0) for ph in PHASES):.3f}" for k in KINDS]
            + [f"**{tot:.3f}**"]
        )
        body += [
            "",
            "One step under `jax.profiler` (`xla_trace.py`): self time in seconds of the "
            "compiled step's XLA operations by phase and kind (the profiled step runs "
            "slower than the timed ones; the shares are what matters):",
            "",
            *common.markdown_table(["phase", *KINDS, "total"], cells, align="lrrrrr"),
            "",
            "The operations that take longest:",
            "",
            *common.markdown_table(
                ["operation", "s", "share", "phase", "kind", "JAX op"],
                [
                    [
                        f"`{n}`",
                        f"{t:.3f}",
                        f"{100 * t / tot:.1f}%",
                        ph,
                        k,
                        f"`{'/'.join(op.split('/')[-2:]) or '-'}`",
                    ]
                    for n, t, ph, k, op in trace["top"][:12]
                ],
                align="lrrlll",
            ),
        ]
        metrics.update(
            trace_total_s=tot, trace={f"{ph}/{k}": v for (ph, k), v in trace["table"].items()}
        )
    return common.report(
        args.out,
        __file__,
        argv,
        title=f"Train-step profile — {args.model}",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
