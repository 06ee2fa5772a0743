"""Where one decode step of the paged engine spends its time (issue 16 (a), the profile).

The paged engine on workload (a) (``bench_engine.py``: B prompts × G samples, fixed prompt
length, stop tokens off), advanced ``--warm-chunks`` chunks into generation, then one decode
step of every slot (the body of ``decode_chunk``: draw, record, one token through the paged
trunk, unembed) as its own jitted program, state donated as in the engine:

* its wall time (best of ``--repeats``) and the tokens/s that implies for S slots;
* the same step's dense matmuls alone at its shapes (q/k/v/o, gate/up/down per layer, the
  unembedding; M = S rows), one jitted program scanned over the layers like the model: the
  floor a perfectly fused step would reach with XLA's matmuls at this M;
* one step under ``jax.profiler`` (``xla_trace.py``): self time by kind (matmul, elementwise /
  reduce, copy / layout, control flow) and the operations that take longest, with the JAX
  operation each comes from.

Full run:    python tools/bench/profile_decode_step.py --out tools/bench/results/decode_profile.md
Smoke test:  python tools/bench/profile_decode_step.py --smoke --out /tmp/decode_profile.md
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
    p.add_argument("--model", default=common.DEFAULT_MODEL, help="alias/path or 'tiny'")
    p.add_argument("--smoke", action="store_true", help="tiny model, tiny workload")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--chunk-steps", type=int, default=16)
    p.add_argument("--warm-chunks", type=int, default=4, help="chunks decoded before profiling")
    p.add_argument("--sampling", action="store_true", help="τ = 1, top-p 0.95 (else greedy)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--top", type=int, default=15, help="operations listed")
    p.add_argument("--out", default=None, help="write the markdown report here")
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.prompts, args.group, args.prompt_len = common.TINY, 2, 2, 8
        args.new_tokens, args.page_size, args.chunk_steps, args.warm_chunks = 16, 4, 4, 1
        args.repeats, args.top = 2, 5
    return args


def _matmul_floor(config, rows: int, repeats: int) -> tuple[float, float]:
    """(seconds, FLOPs) of one step's dense matmuls alone at M = ``rows``."""
    import jax
    import jax.numpy as jnp

    d, f, v, n = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_layers
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    o_in = config.num_heads * config.head_dim
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    w = {
        "qkv": jax.random.normal(k[0], (n, d, qkv)) * 0.02,
        "o": jax.random.normal(k[1], (n, o_in, d)) * 0.02,
        "gate": jax.random.normal(k[2], (n, d, f)) * 0.02,
        "up": jax.random.normal(k[3], (n, d, f)) * 0.02,
        "down": jax.random.normal(k[4], (n, f, d)) * 0.02,
    }
    emb = jax.random.normal(k[5], (v, d)) * 0.02
    x0 = jnp.ones((rows, d), jnp.float32)

    def program(w, emb, x):
        def layer(x, lw):
            a = x @ lw["qkv"]
            x = x + a[:, :o_in] @ lw["o"]
            h = jax.nn.silu(x @ lw["gate"]) * (x @ lw["up"])
            return x + h @ lw["down"], None

        x, _ = jax.lax.scan(layer, x, w)
        return x @ emb.T

    fn = jax.jit(program)
    flops = 2.0 * rows * (n * (d * qkv + o_in * d + 3 * d * f) + d * v)
    return common.best_time(lambda: fn(w, emb, x0).block_until_ready(), repeats), flops


def main(argv=None) -> int:
    args = _parse(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from xla_trace import KINDS, op_time_breakdown

    from jaxrl_llm.sampling import PagedEngine, SamplingConfig
    from jaxrl_llm.sampling.slots import _step_rows

    config, params, _ = common.load_model(args.model)
    rng = np.random.default_rng(0)
    low = 3 if config.vocab_size > 3 else 0
    sampling = (
        SamplingConfig(temperature=1.0, top_p=0.95, use_model_eos=False)
        if args.sampling
        else SamplingConfig(greedy=True, use_model_eos=False)
    )
    slots = args.prompts * args.group
    engine = PagedEngine(
        params,
        config,
        sampling=sampling,
        num_slots=slots,
        page_size=args.page_size,
        max_len=args.prompt_len + args.new_tokens,
        gen_len=args.new_tokens,
        chunk_steps=args.chunk_steps,
    )
    for b in range(args.prompts):
        prompt = rng.integers(low, config.vocab_size, size=args.prompt_len).tolist()
        engine.submit(prompt, prompt_id=b, num_samples=args.group, max_new_tokens=args.new_tokens)
    for _ in range(args.warm_chunks):
        engine.step()
    filled = int(np.asarray(engine.state.cache_len).max())
    width = engine.width
    common.log(f"profiling one step at {filled} filled slots per row, table width {width} pages")
    step = jax.jit(
        functools.partial(
            _step_rows,
            config=engine.config,
            sampling=engine._sampling,
            pad_id=engine.pad_id,
            width=width,
        ),
        donate_argnums=(0,),
    )
    # the engine's state carries a leading replica dimension (one replica here): one slice
    state = jax.tree.map(lambda x: x[0], engine.state)
    box = {"s": state._replace(budget=jnp.full((slots,), 10**6, jnp.int32))}

    def one():
        box["s"] = step(box["s"], engine._stop, engine.params)
        return box["s"].logits

    jax.block_until_ready(one())  # compile
    t_step = common.best_time(lambda: jax.block_until_ready(one()), args.repeats)
    t_mm, flops = _matmul_floor(config, slots, args.repeats)
    prof = op_time_breakdown(step, box["s"], engine._stop, engine.params)
    total = prof["total_s"]
    by_kind = {kd: sum(s for (_, k2), s in prof["table"].items() if k2 == kd) for kd in KINDS}
    rows = [
        ["decode step, wall (untraced)", f"{t_step * 1e3:.1f}", f"{slots / t_step:.0f}"],
        [
            f"its dense matmuls alone (M = {slots}, {flops / t_mm / 1e9:.0f} GFLOP/s)",
            f"{t_mm * 1e3:.1f}",
            f"{slots / t_mm:.0f}",
        ],
    ]
    kinds = [[kd, f"{by_kind[kd] * 1e3:.1f}", f"{100 * by_kind[kd] / total:.0f}%"] for kd in KINDS]
    top = [
        [name, f"{s * 1e3:.2f}", kind, (op or "(none)")[-70:].replace("|", "\\|")]
        for name, s, _, kind, op in prof["top"][: args.top]
    ]
    body = [
        f"Model: {args.model} ({common.fmt_params(sum(x.size for x in jax.tree.leaves(params)))}"
        f" parameters), float32, {'sampling τ = 1, top-p 0.95' if args.sampling else 'greedy'}; "
        f"{slots} slots ({args.prompts} prompts × G = {args.group}), {args.prompt_len}-token "
        f"prompts, profiled after {args.warm_chunks} chunks of {args.chunk_steps} steps "
        f"({filled} filled cache slots per row; attention reads {width} pages of "
        f"{args.page_size}).",
        "",
        *common.markdown_table(["program", "ms", "tokens/s"], rows, align="lrr"),
        "",
        f"Under the profiler (self time of the step's XLA operations, Σ {total * 1e3:.1f} ms; "
        "tracing adds overhead per operation):",
        "",
        *common.markdown_table(["kind", "ms", "share"], kinds, align="lrr"),
        "",
        *common.markdown_table(["operation", "ms", "kind", "from (JAX op_name, tail)"], top),
    ]
    metrics = {
        "step_ms": t_step * 1e3,
        "matmul_floor_ms": t_mm * 1e3,
        "traced_total_ms": total * 1e3,
        **{f"traced_{k}_ms": v * 1e3 for k, v in by_kind.items()},
    }
    return common.report(
        args.out,
        __file__,
        argv,
        title="Profile of one paged decode step",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    raise SystemExit(main())
