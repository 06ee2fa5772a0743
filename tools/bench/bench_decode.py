"""Decode throughput of jaxrl_llm.sampling vs transformers' generate and the roofline.

Measures, in one run, on the machine it runs on:
  1. our tokens/s (greedy and sampling) for B prompts × G samples (prefix shared);
  2. transformers ``generate`` on the same B·G rows (torch on the GPU when it sees one, else
     on the CPU with the same thread count);
  3. the roofline of a decode step: max(compute, memory) time, where compute is
     2 · parameters · rows FLOPs at a measured float32 matmul rate (a square matmul, and the
     skinny [rows, D] × [D, V] one for reference) and memory is the weights plus the KV cache
     (the loop reads every cache slot) at a measured streaming bandwidth;
  4. prompt prefix sharing vs repeated prefill (long prompts, large G).
Writes a markdown section (with the exact command and a machine description) to --out and its
headline numbers to the .json next to it.

Full run:    python tools/bench/bench_decode.py --out tools/bench/results/decode.md
Smoke test:  python tools/bench/bench_decode.py --model tiny --prompts 2 --group 2 \
    --prompt-len 8 --new-tokens 8 --prefix-prompt-len 16 --prefix-group 2 --out /tmp/d.md
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default=common.DEFAULT_MODEL,
        help="model alias/path for jaxrl_llm.interop.load_model, or 'tiny' (random)",
    )
    p.add_argument("--prompts", type=int, default=4, help="B prompts")
    p.add_argument("--group", type=int, default=8, help="G samples per prompt")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prefix-prompts", type=int, default=2)
    p.add_argument("--prefix-prompt-len", type=int, default=512)
    p.add_argument("--prefix-group", type=int, default=16)
    p.add_argument("--prefix-new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2, help="timed repetitions (best is kept)")
    p.add_argument("--matmul-n", type=int, default=1024, help="size of the square matmul")
    p.add_argument(
        "--bandwidth-mib",
        type=int,
        default=1024,
        help="MiB streamed by the bandwidth measurement (> last-level cache)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count(),
        help="torch CPU threads (XLA's CPU client uses every core)",
    )
    p.add_argument("--skip-hf", action="store_true", help="skip transformers generate")
    p.add_argument(
        "--both-layer-loops",
        action="store_true",
        help="also time greedy with the other layer loop (rollout's separate= flipped: "
        "scanned stacked weights vs separate per-layer arrays)",
    )
    p.add_argument("--out", default=None, help="write the markdown report here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_llm.sampling import SamplingConfig, init_decode_state, pad_prompts, prefill, rollout

    config, params, _ = common.load_model(args.model)
    n_params = config.num_params()
    b, g, p_len, m = args.prompts, args.group, args.prompt_len, args.new_tokens
    n = b * g
    common.log(
        f"model {args.model}: {common.fmt_params(n_params)} params; B={b} G={g} P={p_len} M={m}"
    )

    rng = np.random.default_rng(0)
    low = 3 if config.vocab_size > 3 else 0
    prompts = [rng.integers(low, config.vocab_size, size=p_len).tolist() for _ in range(b)]
    tokens, mask = pad_prompts(prompts, length=p_len)
    rows = []  # (what, tokens/s, seconds, note)
    metrics: dict[str, float] = {}

    # Every row runs all M steps: stop tokens are disabled so throughput is comparable.
    modes = {
        "greedy": SamplingConfig(greedy=True, use_model_eos=False),
        "sampling": SamplingConfig(temperature=1.0, top_p=0.95, use_model_eos=False),
    }
    label = {"greedy": "greedy", "sampling": "sampling (τ=1, top-p 0.95)"}
    other = jax.default_backend() != "gpu"  # rollout's default is separate on GPU only
    if args.both_layer_loops:
        modes["greedy, other layer loop"] = modes["greedy"]
        label["greedy, other layer loop"] = "greedy, " + (
            "separate layer arrays" if other else "scanned stacked layers"
        )
    for name, s in modes.items():
        run = lambda: rollout(
            params,
            tokens,
            mask,
            config=config,
            sampling=s,
            num_samples=g,
            max_new_tokens=m,
            gen_len=m,
            separate=other if name == "greedy, other layer loop" else None,
        ).tokens.block_until_ready()
        first = common.timed_first_call(run)
        t = common.best_time(run, args.repeats)
        rows.append(
            (
                f"jaxrl_llm {label[name]}",
                n * m / t,
                t,
                f"prefill + decode, first call {first:.1f}s incl. compile",
            )
        )
        metrics[f"jax_{name.replace(', ', '_').replace(' ', '_')}_tokens_per_s"] = n * m / t
        common.log(rows[-1])

    skip_note = None
    if not args.skip_hf and not (common.have("torch") and common.have("transformers")):
        skip_note = "transformers generate not run: torch/transformers are not installed"
        common.log(skip_note)
    if not args.skip_hf and skip_note is None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args.threads)
        device = common.torch_device()
        hf = (
            AutoModelForCausalLM.from_pretrained(
                common.hf_model_dir(args.model, config, params),
                local_files_only=True,
                dtype=getattr(torch, config.param_dtype),
            )
            .eval()
            .to(device)
        )
        ids = torch.tensor(np.repeat(tokens, g, axis=0), dtype=torch.long, device=device)
        am = torch.ones_like(ids)
        where = (
            f"{torch.cuda.get_device_name(0)}"
            if device == "cuda"
            else f"CPU, {args.threads} threads"
        )
        for name, kw in {
            "greedy": dict(do_sample=False),
            "sampling": dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=0),
        }.items():

            def run_hf():
                with torch.no_grad():
                    hf.generate(
                        ids,
                        attention_mask=am,
                        max_new_tokens=m,
                        min_new_tokens=m,
                        pad_token_id=config.pad_token_id or 0,
                        **kw,
                    )
                if device == "cuda":
                    torch.cuda.synchronize()

            run_hf()  # warm-up
            t = common.best_time(run_hf, args.repeats)
            rows.append(
                (
                    f"transformers generate {label[name]}",
                    n * m / t,
                    t,
                    f"torch {torch.__version__} on {where}, {n} rows (prompt repeated G times)",
                )
            )
            metrics[f"hf_{name}_tokens_per_s"] = n * m / t
            common.log(rows[-1])

    # Roofline of one decode step over all N rows (attention FLOPs excluded).
    flops_step = 2.0 * n_params * n
    square = common.matmul_rate(args.matmul_n, args.matmul_n, args.matmul_n)
    skinny = common.matmul_rate(n, config.hidden_size, config.vocab_size)
    bw = common.memory_bandwidth(nbytes=args.bandwidth_mib * 2**20)
    p_bytes = n_params * jnp.dtype(config.param_jnp_dtype).itemsize
    kv_bytes = (
        n
        * (p_len + m)
        * config.num_layers
        * 2
        * config.num_kv_heads
        * config.head_dim
        * jnp.dtype(config.compute_jnp_dtype).itemsize
    )
    t_square, t_skinny = flops_step / square, flops_step / skinny
    t_mem = (p_bytes + kv_bytes) / bw
    roof = [
        (
            f"compute roofline (square {args.matmul_n}³ matmul: {square / 1e9:.1f} GFLOP/s)",
            t_square,
            f"2·{common.fmt_params(n_params)}·{n} FLOPs per step",
        ),
        (
            f"compute roofline (skinny [{n}, {config.hidden_size}]×[{config.hidden_size}, "
            f"{config.vocab_size}] matmul: {skinny / 1e9:.1f} GFLOP/s)",
            t_skinny,
            "same FLOPs at the decode-shaped matmul's rate",
        ),
        (
            f"memory roofline (streaming {bw / 1e9:.1f} GB/s)",
            t_mem,
            f"{p_bytes / 1e6:.3g} MB weights + {kv_bytes / 1e6:.3g} MB KV cache read per step",
        ),
    ]
    for what, step, note in roof:
        rows.append((what, n / step, step * m, note))
    t_roof = max(t_square, t_mem)
    sheet = common.datasheet()
    if sheet is not None:  # an accelerator: the limit is its datasheet, not a measured matmul
        flops_by_dtype, sheet_bw = sheet
        # float32 matmuls run as TF32 under XLA's default precision on GPU
        key = "tf32" if config.compute_dtype == "float32" else config.compute_dtype
        t_sheet_flops = flops_step / flops_by_dtype[key]
        t_sheet_mem = (p_bytes + kv_bytes) / sheet_bw
        rows.append(
            (
                f"datasheet roofline ({key} {flops_by_dtype[key] / 1e12:.0f} TFLOP/s, "
                f"{sheet_bw / 1e12:.2f} TB/s)",
                n / max(t_sheet_flops, t_sheet_mem),
                max(t_sheet_flops, t_sheet_mem) * m,
                f"{jax.devices()[0].device_kind}; the suite's roofline on this device",
            )
        )
        t_square, t_mem = t_sheet_flops, t_sheet_mem
        t_roof = max(t_square, t_mem)
        metrics["datasheet_roofline_tokens_per_s"] = n / t_roof
    metrics.update(
        roofline_tokens_per_s=n / t_roof,
        roofline_compute_tokens_per_s=n / t_square,
        roofline_skinny_tokens_per_s=n / t_skinny,
        roofline_memory_tokens_per_s=n / t_mem,
        matmul_flops=square,
        bandwidth_bytes_per_s=bw,
    )
    bound = "memory" if t_mem > t_square else "compute"

    # Prefix sharing vs repeated prefill.
    pb, pg, pl, pm = (
        args.prefix_prompts,
        args.prefix_group,
        args.prefix_prompt_len,
        args.prefix_new_tokens,
    )
    long_prompts = [rng.integers(low, config.vocab_size, size=pl).tolist() for _ in range(pb)]
    lt, lm = pad_prompts(long_prompts, length=pl)
    rt, rmask = np.repeat(lt, pg, axis=0), np.repeat(lm, pg, axis=0)
    greedy = SamplingConfig(greedy=True, use_model_eos=False)

    def shared_prefill():
        logits, cache, pos = prefill(params, lt, lm, config=config, cache_len=pl + pm)
        jax.block_until_ready(
            init_decode_state(
                logits,
                cache,
                pos,
                jnp.arange(pb),
                seed=0,
                num_samples=pg,
                gen_len=pm,
                max_new_tokens=pm,
            )
        )

    def repeated_prefill():
        logits, cache, pos = prefill(params, rt, rmask, config=config, cache_len=pl + pm)
        jax.block_until_ready(
            init_decode_state(
                logits,
                cache,
                pos,
                jnp.arange(pb * pg),
                seed=0,
                num_samples=1,
                gen_len=pm,
                max_new_tokens=pm,
            )
        )

    def shared_e2e():
        rollout(
            params,
            lt,
            lm,
            config=config,
            sampling=greedy,
            num_samples=pg,
            max_new_tokens=pm,
            gen_len=pm,
        ).tokens.block_until_ready()

    def repeated_e2e():
        rollout(
            params,
            rt,
            rmask,
            config=config,
            sampling=greedy,
            num_samples=1,
            max_new_tokens=pm,
            gen_len=pm,
        ).tokens.block_until_ready()

    prefix_rows = []
    for what, fn in [
        ("prefill, prefix shared (B rows, cache repeated G×)", shared_prefill),
        ("prefill, repeated prompts (B·G rows)", repeated_prefill),
        (f"prefill + {pm} tokens, prefix shared", shared_e2e),
        (f"prefill + {pm} tokens, repeated prompts", repeated_e2e),
    ]:
        fn()
        prefix_rows.append((what, common.best_time(fn, args.repeats)))
        common.log(prefix_rows[-1])
    metrics.update(
        prefix_prefill_speedup=prefix_rows[1][1] / prefix_rows[0][1],
        prefix_e2e_speedup=prefix_rows[3][1] / prefix_rows[2][1],
        prefix_shared_s=prefix_rows[2][1],
        prefix_repeated_s=prefix_rows[3][1],
    )

    ours = metrics["jax_greedy_tokens_per_s"]
    body = [
        f"Model: {args.model} ({common.fmt_params(n_params)} parameters, {config.param_dtype}); "
        f"B={b} prompts × G={g} samples = {n} rows; {p_len}-token prompts; {m} new tokens per "
        f"row (stop tokens disabled). Best of {args.repeats} timed runs after a warm-up.",
        "",
        *common.markdown_table(
            ["what", "tokens/s", "seconds", "note"],
            [[w, f"{tps:,.1f}", f"{s:.3f}", note] for w, tps, s, note in rows],
            align="lrrl",
        ),
        "",
        f"Roofline = max(compute at the "
        f"{'datasheet' if sheet is not None else 'square-matmul'} rate, memory) per step: "
        f"{n / t_roof:,.1f} tokens/s ({bound}-bound); jaxrl_llm greedy reaches "
        f"{100 * ours / (n / t_roof):.0f}% of it.",
    ]
    for name in ("greedy", "sampling"):
        if f"hf_{name}_tokens_per_s" in metrics:
            r = metrics[f"jax_{name}_tokens_per_s"] / metrics[f"hf_{name}_tokens_per_s"]
            metrics[f"speedup_vs_hf_{name}"] = r
            body.append(f"jaxrl_llm vs transformers, {label[name]}: {r:.2f}×.")
    if skip_note:
        body.append(skip_note + " (`pip install -e .[dev]`).")
    metrics["roofline_fraction_greedy"] = ours / (n / t_roof)
    body += [
        "",
        f"Prefix sharing: {pb} prompts × {pl} tokens, G={pg} ({pb * pg} rows).",
        "",
        *common.markdown_table(
            ["what", "seconds"], [[w, f"{s:.3f}"] for w, s in prefix_rows], align="lr"
        ),
        "",
        f"Prefix sharing gain: prefill {metrics['prefix_prefill_speedup']:.1f}×, prefill + "
        f"{pm} tokens {metrics['prefix_e2e_speedup']:.1f}×.",
    ]
    return common.report(
        args.out,
        __file__,
        argv,
        title="Decode throughput (jaxrl_llm.sampling)",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
