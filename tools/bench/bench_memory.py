"""Peak memory of a GRPO-style policy-gradient train step: full [B, T, V] logits vs the chunked
log-probs from hidden states, from XLA's compiled memory analysis (no weights needed).

SmolLM2-135M shapes (V = 49,152), float32, AdamW, rows = prompts × G, T = prompt + completion.
Reported: XLA's argument + output − aliased + temporary bytes of the compiled step, and the
estimate of ``jaxrl_llm.train.memory.estimate_memory`` for the same run.

Usage: python tools/bench/bench_memory.py [--rows 32] [--seq 320] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm import models, ops
from jaxrl_llm.train.memory import estimate_memory


def step_peak_bytes(config, rows: int, seq: int, *, chunked: bool, remat: str = "none") -> int:
    opt = optax.adamw(1e-5)

    def loss(params, ids, mask, adv):
        out = models.apply(params, ids, config=config, attention_mask=mask, remat=remat)
        if chunked:
            lp = ops.token_logprobs_from_hidden(out.hidden[:, :-1], out.unembed, ids[:, 1:],
                                                chunk_size=128)
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
    args = (p, s, jax.ShapeDtypeStruct((rows, seq), jnp.int32),
            jax.ShapeDtypeStruct((rows, seq), jnp.int32),
            jax.ShapeDtypeStruct((rows, seq), jnp.float32))
    ma = jax.jit(step, donate_argnums=(0, 1)).lower(*args).compile().memory_analysis()
    return (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
            + ma.temp_size_in_bytes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32, help="rows per step (prompts x G)")
    ap.add_argument("--seq", type=int, default=320, help="tokens per row")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    config = models.ModelConfig.smollm2_135m()
    gib = 1024 ** 3
    table = []
    peaks = {}
    for remat in ("none", "full"):
        for kind in ("full", "chunked"):
            peak = step_peak_bytes(config, args.rows, args.seq, chunked=kind == "chunked",
                                   remat=remat)
            peaks[remat, kind] = peak
            est = estimate_memory(config, "sft", batch_size=args.rows, seq_len=args.seq,
                                  dtype="fp32", logits=kind, remat=remat,
                                  device="cpu").total_bytes_per_device
            what = "full [B, T, V] logits" if kind == "full" else "hidden states, 128-token chunks"
            table.append(f"| {remat} | {what} | {peak / gib:.2f} | {est / gib:.2f} |")
    lines = [
        "### Peak memory of a policy-gradient train step: full logits vs chunked log-probs",
        "",
        f"Command: `python {' '.join(['tools/bench/bench_memory.py'] + (argv or sys.argv[1:]))}`",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__} "
        f"({jax.default_backend()}); memory from XLA's compiled memory analysis.",
        f"SmolLM2-135M shapes, float32, AdamW; {args.rows} rows × {args.seq} tokens.",
        "",
        "| remat | log-probs from | XLA peak (GiB) | estimator (GiB) |",
        "|---|---|---|---|",
        *table,
        "",
    ]
    for remat in ("none", "full"):
        full, chunked = peaks[remat, "full"], peaks[remat, "chunked"]
        lines.append(f"remat={remat}: chunking saves {(full - chunked) / gib:.2f} GiB "
                     f"({100 * (1 - chunked / full):.0f}% of the step's peak).")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
