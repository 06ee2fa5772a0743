"""How far apart two float32 computations of the same log-probs land (issue 16 §5).

The sampler records log π(y_t) while decoding (one token per row per step, attending over its
cache); the trainer recomputes them teacher-forced over whole rows. Beside that gap, this
measures the trainer against *itself* on the same tokens when only the batch layout changes,
the floor any sampler-vs-trainer comparison stands on:

1. the trainer's forward (jitted, SmolLM2-135M, float32) on B rows × T tokens vs the same rows
   (a) one per call, (b) four per call, (c) left-padded by ``--pad`` more positions;
2. the paged engine's recorded log-probs (greedy, the rows as its output lays them out) vs the
   trainer's teacher-forced ones on the same tokens;
3. one matmul, ``[M, K] × [K, N]`` on N(0, 1) data: the rows of a large M (T·B, a trainer's
   forward) against the same rows computed with M = B (a decode step), for SmolLM2's K, N.

Full run:   python tools/bench/bench_logprob_floor.py --out tools/bench/results/logprob_floor.md
Smoke test: python tools/bench/bench_logprob_floor.py --smoke
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=common.DEFAULT_MODEL, help="alias/path or 'tiny'")
    p.add_argument("--smoke", action="store_true", help="tiny model, tiny shapes")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--length", type=int, default=96)
    p.add_argument("--pad", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32, help="engine rows: tokens generated")
    p.add_argument("--out", default=None, help="write the markdown report here")
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.rows, args.length, args.pad, args.new_tokens = common.TINY, 4, 16, 8, 8
    return args


def _gap(a, b) -> tuple[float, float, bool]:
    import numpy as np

    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(d.max()), float(d.mean()), bool(np.array_equal(a, b))


def main(argv=None) -> int:
    args = _parse(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_llm.models import forward
    from jaxrl_llm.ops import token_logprobs
    from jaxrl_llm.sampling import SamplingConfig, generate_paged

    config, params, _ = common.load_model(args.model)
    rng = np.random.default_rng(0)
    b, t = args.rows, args.length
    low = 3 if config.vocab_size > 3 else 0
    tokens = jnp.asarray(rng.integers(low, config.vocab_size, (b, t)), jnp.int32)
    mask = jnp.ones((b, t), jnp.int32)
    fwd = jax.jit(lambda p, x, m: forward(p, x, config=config, attention_mask=m)[0])

    def logps(x, m):
        return np.asarray(token_logprobs(fwd(params, x, m)[:, :-1], x[:, 1:], temperature=1.0))

    common.log("trainer forward, B rows at once")
    ref = logps(tokens, mask)
    one = np.concatenate([logps(tokens[i : i + 1], mask[i : i + 1]) for i in range(b)])
    q = max(1, b // 2)
    halves = np.concatenate([logps(tokens[i : i + q], mask[i : i + q]) for i in range(0, b, q)])
    zeros = jnp.zeros((b, args.pad), jnp.int32)
    padded = logps(jnp.concatenate([zeros, tokens], 1), jnp.concatenate([zeros, mask], 1))
    padded = padded[:, args.pad :]

    common.log("paged engine, greedy")
    n_prompts = min(4, b)
    prompts = [tokens[i, : t // 2 + 3 * i].tolist() for i in range(n_prompts)]
    out = generate_paged(
        params,
        config,
        prompts,
        sampling=SamplingConfig(greedy=True, use_model_eos=False),
        max_new_tokens=args.new_tokens,
        num_slots=2,
        page_size=16,
        chunk_steps=8,
    )
    seq = jnp.concatenate([out.prompt_tokens, out.tokens], axis=1)
    seq_mask = jnp.concatenate([out.prompt_mask, out.mask], axis=1)
    p = out.prompt_tokens.shape[1]
    teacher = token_logprobs(fwd(params, seq, seq_mask)[:, p - 1 : -1], out.tokens, temperature=1.0)
    m = np.asarray(out.mask) > 0
    sampler = (np.asarray(out.logprobs)[m], np.asarray(teacher)[m])

    common.log("matmuls")
    mm_rows = []
    d, f = config.hidden_size, config.intermediate_size
    for k_dim, n_dim in [(d, d), (d, f), (f, d), (d, config.vocab_size)]:
        keys = jax.random.split(jax.random.PRNGKey(0), 2)
        w = jax.random.normal(keys[0], (k_dim, n_dim))
        x = jax.random.normal(keys[1], (b, t, k_dim))
        mm = jax.jit(lambda a, w: a @ w)
        big = np.asarray(mm(x.reshape(b * t, k_dim), w)).reshape(b, t, n_dim)
        small = np.stack([np.asarray(mm(x[:, j], w)) for j in (0, t // 2, t - 1)], axis=1)
        mx, mean, same = _gap(small, big[:, [0, t // 2, t - 1]])
        mm_rows.append(
            [
                f"[{b}, {k_dim}] × [{k_dim}, {n_dim}] vs M = {b * t}",
                f"{mx:.3g}",
                f"{mean:.3g}",
                "yes" if same else "no",
            ]
        )

    comp = [
        ("trainer: one row per call", one),
        (f"trainer: {q} rows per call", halves),
        (f"trainer: rows left-padded by {args.pad}", padded),
    ]
    rows = []
    metrics: dict[str, float] = {}
    for name, x in comp:
        mx, mean, same = _gap(x, ref)
        rows.append([name, f"{mx:.3g}", f"{mean:.3g}", "yes" if same else "no"])
        metrics[name] = mx
    mx, mean, same = _gap(*sampler)
    rows.append(
        [
            "paged engine (greedy, 2 slots, refills) vs trainer",
            f"{mx:.3g}",
            f"{mean:.3g}",
            "yes" if same else "no",
        ]
    )
    metrics["sampler_vs_trainer_max"] = mx
    body = [
        f"Model: {args.model}, float32, jax {jax.__version__}. Trainer reference: {b} rows × "
        f"{t} random tokens in one jitted forward; engine rows: {n_prompts} prompts, "
        f"{args.new_tokens} greedy tokens each.",
        "",
        *common.markdown_table(
            [
                "log-probs compared with the trainer's (B rows at once)",
                "max \\|Δ log p\\|",
                "mean \\|Δ log p\\|",
                "bitwise",
            ],
            rows,
        ),
        "",
        *common.markdown_table(
            [
                "matmul rows (N(0,1) data), same rows at two M",
                "max \\|Δ\\|",
                "mean \\|Δ\\|",
                "bitwise",
            ],
            mm_rows,
        ),
    ]
    return common.report(
        args.out,
        __file__,
        argv,
        title="Log-prob floor: trainer vs itself, sampler vs trainer",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    raise SystemExit(main())
