"""Peak memory of a GRPO-style policy-gradient train step: full [B, T, V] logits vs the chunked
log-probs from hidden states, from XLA's compiled memory analysis (no weights needed).

The named model's shapes (default SmolLM2-135M, V = 49,152), float32, AdamW, rows = prompts × G,
T = prompt + completion. Reported: XLA's argument + output − aliased + temporary bytes of the
compiled step, and the estimate of ``jaxrl_llm.train.compile.memory.estimate_memory`` for the same run.
Writes a markdown section to --out and its headline numbers to the .json next to it.

Full run:    python tools/bench/bench_memory.py --out tools/bench/results/memory.md
Smoke test:  python tools/bench/bench_memory.py --model tiny --rows 4 --seq 32 --out /tmp/m.md
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm import models, ops
from jaxrl_llm.train.compile.memory import estimate_memory

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def step_peak_bytes(
    config, rows: int, seq: int, *, chunked: bool, remat: str = "none", chunk: int = 128
) -> int:
    opt = optax.adamw(1e-5)

    def loss(params, ids, mask, adv):
        out = models.apply(params, ids, config=config, attention_mask=mask, remat=remat)
        if chunked:
            lp = ops.token_logprobs_from_hidden(
                out.hidden[:, :-1], out.unembed, ids[:, 1:], chunk_size=chunk
            )
        else:
            logits = models.logits_from_hidden(params, out.hidden[:, :-1], config)
            lp = ops.token_logprobs(logits, ids[:, 1:])
        m = mask[:, 1:]
        ratio = jnp.exp(lp - jax.lax.stop_gradient(lp))
        return -ops.masked_mean(ratio * adv[:, 1:], m)

    def step(params, state, ids, mask, adv):
        g = jax.grad(loss)(params, ids, mask, adv)
        u, state = opt.update(g, state, params)
        return optax.apply_updates(params, u), state

    p = jax.eval_shape(lambda: models.init_params(config, jax.random.PRNGKey(0)))
    s = jax.eval_shape(opt.init, p)
    args = (
        p,
        s,
        jax.ShapeDtypeStruct((rows, seq), jnp.int32),
        jax.ShapeDtypeStruct((rows, seq), jnp.int32),
        jax.ShapeDtypeStruct((rows, seq), jnp.float32),
    )
    ma = jax.jit(step, donate_argnums=(0, 1)).lower(*args).compile().memory_analysis()
    return (
        ma.argument_size_in_bytes
        + ma.output_size_in_bytes
        - ma.alias_size_in_bytes
        + ma.temp_size_in_bytes
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        default=common.DEFAULT_MODEL,
        help="whose shapes to use: an alias/path, or 'tiny' (smoke test)",
    )
    ap.add_argument("--rows", type=int, default=32, help="rows per step (prompts x G)")
    ap.add_argument("--seq", type=int, default=320, help="tokens per row")
    ap.add_argument("--chunk", type=int, default=128, help="log-prob chunk length")
    ap.add_argument(
        "--remat",
        default="none,full",
        help="comma-separated remat policies to measure (none, full)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    config = common.model_config(args.model)
    table = []
    peaks = {}
    remats = [x.strip() for x in args.remat.split(",") if x.strip()]
    for remat in remats:
        for kind in ("full", "chunked"):
            peak = step_peak_bytes(
                config,
                args.rows,
                args.seq,
                chunked=kind == "chunked",
                remat=remat,
                chunk=args.chunk,
            )
            peaks[remat, kind] = peak
            est = estimate_memory(
                config,
                "sft",
                batch_size=args.rows,
                seq_len=args.seq,
                dtype="fp32",
                logits=kind,
                remat=remat,
                device="cpu",
            ).total_bytes_per_device
            what = (
                "full [B, T, V] logits"
                if kind == "full"
                else f"hidden states, {args.chunk}-token chunks"
            )
            table.append([remat, what, peak, est])
    big = max(max(r[2], r[3]) for r in table) >= 2**30 / 10
    unit, scale = ("GiB", 2**30) if big else ("MiB", 2**20)
    table = [[r[0], r[1], f"{r[2] / scale:.2f}", f"{r[3] / scale:.2f}"] for r in table]
    body = [
        f"{args.model} shapes ({common.fmt_params(config.num_params())} parameters, V = "
        f"{config.vocab_size:,}), float32, AdamW; {args.rows} rows × {args.seq} tokens; "
        f"memory from XLA's compiled memory analysis on {jax.default_backend()}.",
        "",
        *common.markdown_table(
            ["remat", "log-probs from", f"XLA peak ({unit})", f"estimator ({unit})"],
            table,
            align="llrr",
        ),
        "",
    ]
    metrics = {}
    for remat in remats:
        full, chunked = peaks[remat, "full"], peaks[remat, "chunked"]
        metrics[f"peak_full_{remat}_bytes"] = full
        metrics[f"peak_chunked_{remat}_bytes"] = chunked
        metrics[f"saving_{remat}_fraction"] = 1 - chunked / full
        body.append(
            f"remat={remat}: chunking saves {(full - chunked) / scale:.2f} {unit} "
            f"({100 * (1 - chunked / full):.0f}% of the step's peak)."
        )
    return common.report(
        args.out,
        __file__,
        argv,
        title="Peak memory of a policy-gradient train step: full logits vs chunked log-probs",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
