"""Attention in O(T) memory: naive (scores materialised) vs blockwise (flash formulation).

Three measurements, all in one process so that the naive and blockwise numbers are side by side:

1. Peak memory of a GRPO-style train step (value_and_grad of a sum of per-token log-probs from
   hidden states, chunked, through ``models.apply``) of the named model's shapes (default
   SmolLM2-135M, random weights need not exist: XLA's compiled memory analysis, argument +
   output + temporary bytes), batch 1, at each --seqs length, for each implementation. Nothing
   is run for this, only compiled.
2. Wall time of that step at --time-seq tokens, naive and blockwise alternated --repeats times
   (random weights; the best of each).
3. (--threshold) Attention alone, forward + backward, at the model's head shapes, naive vs
   blockwise for T = S in --threshold-seqs: where the naive path stops being faster, which sets
   ``models.attention.NAIVE_MAX_SCORES``.

Full run:    python tools/bench/bench_attention.py --threshold --out tools/bench/results/attention.md
Smoke test:  python tools/bench/bench_attention.py --model tiny --seqs 64,128 --time-seq 64 \\
                 --repeats 1 --out /tmp/attention.md
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp

from jaxrl_llm import models, ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

IMPLS = (models.AttentionImpl.NAIVE, models.AttentionImpl.BLOCKWISE)


def _step(config):
    """``(params, ids, mask) -> (loss, grads)`` of a per-token log-prob loss."""

    def loss(params, ids, mask):
        out = models.apply(params, ids, config=config, attention_mask=mask)
        lp = ops.token_logprobs_from_hidden(
            out.hidden[:, :-1], out.unembed, ids[:, 1:], chunk_size=256
        )
        return -jnp.sum(lp * mask[:, 1:])

    return jax.jit(jax.value_and_grad(loss))


def compiled_peak_bytes(config, seq: int) -> tuple[int, float]:
    """XLA's argument + output + temporary bytes of the compiled train step, and compile seconds."""
    p = jax.eval_shape(lambda: models.init_params(config, jax.random.PRNGKey(0)))
    ids = jax.ShapeDtypeStruct((1, seq), jnp.int32)
    t0 = time.perf_counter()
    ma = _step(config).lower(p, ids, ids).compile().memory_analysis()
    secs = time.perf_counter() - t0
    return (
        ma.argument_size_in_bytes
        + ma.output_size_in_bytes
        - ma.alias_size_in_bytes
        + ma.temp_size_in_bytes
    ), secs


def time_steps(config, seq: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per train step for each implementation, alternated ``repeats`` times."""
    params = models.init_params(config, jax.random.PRNGKey(0))
    ids = jax.random.randint(jax.random.PRNGKey(1), (1, seq), 0, config.vocab_size)
    mask = jnp.ones((1, seq), jnp.int32)
    fns = {}
    for impl in IMPLS:
        fn = _step(dataclasses.replace(config, attention=impl))
        jax.block_until_ready(fn(params, ids, mask))  # compile + warm up
        fns[impl.value] = fn
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params, ids, mask))
            times[name].append(time.perf_counter() - t0)
    return times


def attention_times(config, seqs: list[int], repeats: int) -> list[tuple[int, float, float]]:
    """(T, naive s, blockwise s) of attention forward + backward at the model's head shapes."""
    h, kh, e = config.num_heads, config.num_kv_heads, config.head_dim
    rows = []
    for t in seqs:
        ks = jax.random.split(jax.random.PRNGKey(t), 3)
        q = jax.random.normal(ks[0], (1, t, h, e))
        k = jax.random.normal(ks[1], (1, t, kh, e))
        v = jax.random.normal(ks[2], (1, t, kh, e))
        mask = models.causal_self_mask(jnp.ones((1, t), bool))
        fns = {}
        for name, fn in (
            ("naive", models.naive_attention),
            ("blockwise", models.blockwise_attention),
        ):
            g = jax.jit(
                jax.grad(lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v, mask) ** 2), argnums=(0, 1, 2))
            )
            jax.block_until_ready(g(q, k, v))
            fns[name] = g
        best = {name: float("inf") for name in fns}
        for _ in range(repeats):
            for name, g in fns.items():
                t0 = time.perf_counter()
                jax.block_until_ready(g(q, k, v))
                best[name] = min(best[name], time.perf_counter() - t0)
        rows.append((t, best["naive"], best["blockwise"]))
        common.log(
            f"attention T={t}: naive {best['naive'] * 1e3:.1f} ms, "
            f"blockwise {best['blockwise'] * 1e3:.1f} ms"
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        default=common.DEFAULT_MODEL,
        help="whose shapes to use: an alias/path, or 'tiny' (smoke test)",
    )
    ap.add_argument("--seqs", default="2048,8192,16384", help="tokens per row for the memory table")
    ap.add_argument("--time-seq", type=int, default=2048, help="tokens per row for the step timing")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per implementation")
    ap.add_argument(
        "--threshold",
        action="store_true",
        help="also time attention alone to choose the naive/blockwise threshold",
    )
    ap.add_argument("--threshold-seqs", default="128,256,512,1024,2048")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    base = common.model_config(args.model)
    seqs = [int(s) for s in args.seqs.split(",") if s.strip()]

    peaks: dict[tuple[str, int], int] = {}
    rows = []
    for seq in seqs:
        row = [f"{seq:,}"]
        for impl in IMPLS:
            peak, secs = compiled_peak_bytes(dataclasses.replace(base, attention=impl), seq)
            peaks[impl.value, seq] = peak
            common.log(f"T={seq} {impl.value}: {peak / 2**30:.2f} GiB (compiled in {secs:.0f} s)")
            row.append(f"{peak / 2**30:.2f}")
        row.append(f"{peaks['blockwise', seq] / peaks['naive', seq]:.3f}")
        rows.append(row)
    body = [
        f"{args.model} shapes ({common.fmt_params(base.num_params())} parameters, "
        f"{base.num_layers} layers, {base.num_heads} heads / {base.num_kv_heads} KV heads, "
        f"head dim {base.head_dim}), float32, batch 1, no rematerialisation; the step is "
        "value_and_grad of the sum of per-token log-probs (chunked from hidden states). Peak = "
        "XLA's compiled argument + output + temporary bytes (compiled, not run).",
        "",
        *common.markdown_table(
            ["T", "naive (GiB)", "blockwise (GiB)", "blockwise / naive"], rows, align="rrrr"
        ),
        "",
    ]
    metrics = {f"peak_{impl}_{seq}_bytes": v for (impl, seq), v in peaks.items()}
    if len(seqs) >= 2:
        lo, hi = seqs[0], seqs[-1]
        for impl in ("naive", "blockwise"):
            growth = peaks[impl, hi] / peaks[impl, lo]
            metrics[f"growth_{impl}"] = growth
            body.append(f"{impl}: peak ×{growth:.1f} from T = {lo:,} to {hi:,} (T ×{hi / lo:.0f}).")
        body.append("")

    times = time_steps(base, args.time_seq, args.repeats)
    ratios = [b / n for n, b in zip(times["naive"], times["blockwise"])]
    body += [
        f"Train step at T = {args.time_seq:,} (random weights), naive and blockwise alternated "
        f"{args.repeats} times in one process; the machine was shared with other jobs, so "
        "compare the ratio of each pair, not absolute seconds:",
        "",
        *common.markdown_table(
            ["pair", "naive (s)", "blockwise (s)", "blockwise / naive"],
            [
                [i + 1, f"{n:.2f}", f"{b:.2f}", f"{r:.2f}"]
                for i, (n, b, r) in enumerate(zip(times["naive"], times["blockwise"], ratios))
            ],
            align="rrrr",
        ),
        "",
    ]
    metrics["step_time_naive_s"] = min(times["naive"])
    metrics["step_time_blockwise_s"] = min(times["blockwise"])
    metrics["step_time_ratio_median"] = sorted(ratios)[len(ratios) // 2]

    if args.threshold:
        att = attention_times(base, [int(s) for s in args.threshold_seqs.split(",")], args.repeats)
        body += [
            "Attention alone (one layer's heads, batch 1, causal, float32), forward + backward, "
            f"best of {args.repeats}; this sets the naive/blockwise threshold "
            f"(`NAIVE_MAX_SCORES` = {models.NAIVE_MAX_SCORES:,} = T·S):",
            "",
            *common.markdown_table(
                ["T = S", "naive (ms)", "blockwise (ms)", "blockwise / naive"],
                [[f"{t:,}", f"{n * 1e3:.1f}", f"{b * 1e3:.1f}", f"{b / n:.2f}"] for t, n, b in att],
                align="rrrr",
            ),
            "",
        ]
        metrics["attention_times"] = [[t, n, b] for t, n, b in att]

    return common.report(
        args.out,
        __file__,
        argv,
        title="Attention memory: naive vs blockwise (flash) attention",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
