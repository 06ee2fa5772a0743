"""Rollout engines side by side: the static engine, the paged continuous-batching engine and
transformers' generate, on issue 16's workloads, in one run.

(a) today's decode case: B prompts × G samples, fixed prompt length, every row generates M
    tokens (stop tokens disabled), greedy and sampling (τ = 1, top-p 0.95), float32;
(b) a long tail: B prompts × G samples, row lengths drawn log-normal (median ``--median``,
    σ ``--sigma``, clipped to [1, M]; the longest rows set to M), forced with per-row stop
    steps in the paged engine; the static engine and transformers run every row to the
    longest length (what a static batch does), so all engines are credited the same useful
    tokens = Σ row lengths;
(c) the paged engine in bfloat16 on (a) and (b) (``--bf16``).
Reported: useful tokens/s, the ratios paged / static and paged / transformers, and the KV
cache slots held per live row (paged, averaged over chunks) against the dense cache's P + M.
Tunix (issue 16 (d)) runs in its own venv: tools/bench/bench_tunix.py (--with-ours times these engines beside it).

Full run:    python tools/bench/bench_engine.py --bf16 --out tools/bench/results/engine.md
Smoke test:  python tools/bench/bench_engine.py --smoke --bf16 --out /tmp/engine.md
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
    p.add_argument("--smoke", action="store_true", help="tiny model, tiny workloads")
    p.add_argument("--a-prompts", type=int, default=4)
    p.add_argument("--a-group", type=int, default=8)
    p.add_argument("--a-prompt-len", type=int, default=64)
    p.add_argument("--a-new-tokens", type=int, default=128)
    p.add_argument("--b-prompts", type=int, default=64)
    p.add_argument("--b-group", type=int, default=4)
    p.add_argument("--b-prompt-len", type=int, default=64)
    p.add_argument("--b-new-tokens", type=int, default=512)
    p.add_argument("--median", type=float, default=60.0, help="(b) median row length")
    p.add_argument("--sigma", type=float, default=1.0, help="(b) log-normal σ")
    p.add_argument("--b-max-rows", type=int, default=4, help="(b) rows forced to the maximum")
    p.add_argument("--num-slots", type=int, default=64, help="paged engine decode slots")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--chunk-steps", type=int, default=16)
    p.add_argument(
        "--bf16", action="store_true", help="also run the paged engine in bfloat16 on (a)"
    )
    p.add_argument(
        "--bf16-b",
        action="store_true",
        help="bfloat16 on (b) too (slow on CPUs where XLA runs bf16 dots slowly)",
    )
    p.add_argument("--repeats", type=int, default=2, help="timed repetitions (best is kept)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads")
    p.add_argument("--skip-hf", action="store_true", help="skip transformers generate")
    p.add_argument(
        "--workloads", default="a,b", help="comma-separated workloads to run: a, b or a,b"
    )
    p.add_argument("--out", default=None, help="write the markdown report here")
    args = p.parse_args(argv)
    if args.smoke:
        args.model = common.TINY
        args.a_prompts, args.a_group, args.a_prompt_len, args.a_new_tokens = 2, 2, 8, 8
        args.b_prompts, args.b_group, args.b_prompt_len, args.b_new_tokens = 4, 2, 8, 24
        args.median, args.b_max_rows, args.num_slots, args.page_size = 6.0, 1, 4, 4
        args.chunk_steps, args.repeats = 4, 1
    return args


def _lengths(args, rng):
    import numpy as np

    n, m = args.b_prompts * args.b_group, args.b_new_tokens
    lens = np.clip(np.round(rng.lognormal(np.log(args.median), args.sigma, n)), 1, m)
    lens[rng.choice(n, size=min(args.b_max_rows, n), replace=False)] = m
    return lens.astype(int).tolist()


def main(argv=None) -> int:
    args = _parse(argv)
    import numpy as np

    from jaxrl_llm.sampling import PagedEngine, SamplingConfig, pad_prompts, rollout

    config, params, _ = common.load_model(args.model)
    rng = np.random.default_rng(0)
    low = 3 if config.vocab_size > 3 else 0
    modes = {
        "greedy": SamplingConfig(greedy=True, use_model_eos=False),
        "sampling": SamplingConfig(temperature=1.0, top_p=0.95, use_model_eos=False),
    }
    hf_kw = {
        "greedy": dict(do_sample=False),
        "sampling": dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=0),
    }
    hf = None
    if not args.skip_hf and common.have("torch") and common.have("transformers"):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args.threads)
        hf_dir = common.hf_model_dir(args.model, config, params)
        hf = AutoModelForCausalLM.from_pretrained(
            hf_dir, local_files_only=True, dtype=torch.float32
        ).eval()

    rows: list[list[str]] = []
    metrics: dict[str, float] = {}
    kv_rows: list[list[str]] = []
    slot_bytes = 2 * config.num_layers * config.num_kv_heads * config.head_dim

    def workload(tag, b, g, p_len, m, budgets, names, bf16):
        prompts = [rng.integers(low, config.vocab_size, size=p_len).tolist() for _ in range(b)]
        tokens, mask = pad_prompts(prompts, length=p_len)
        useful = float(sum(budgets))
        for name in names:
            s = modes[name]

            def static():
                out = rollout(
                    params,
                    tokens,
                    mask,
                    config=config,
                    sampling=s,
                    num_samples=g,
                    max_new_tokens=m,
                    gen_len=m,
                )
                out.tokens.block_until_ready()

            engines = {}

            def paged(dtype):
                eng = PagedEngine(
                    params,
                    config,
                    sampling=s,
                    num_slots=max(min(args.num_slots, b * g), g),  # no idle slots in (a)
                    page_size=args.page_size,
                    max_len=p_len + m,
                    gen_len=m,
                    chunk_steps=args.chunk_steps,
                    dtype=dtype,
                )
                for i, pr in enumerate(prompts):
                    eng.submit(
                        pr, prompt_id=i, num_samples=g, max_new_tokens=budgets[i * g : i * g + g]
                    )
                eng.run()
                engines[dtype] = eng

            runs = [
                ("static engine (float32)", static),
                ("paged engine (float32)", lambda: paged(None)),
            ]
            if bf16:
                runs.append(("paged engine (bfloat16)", lambda: paged("bfloat16")))
            if hf is not None:
                import torch

                ids = torch.tensor(np.repeat(tokens, g, axis=0), dtype=torch.long)

                def run_hf():
                    with torch.no_grad():
                        hf.generate(
                            ids,
                            attention_mask=torch.ones_like(ids),
                            max_new_tokens=m,
                            min_new_tokens=m,
                            pad_token_id=config.pad_token_id or 0,
                            **hf_kw[name],
                        )

                runs.append((f"transformers generate (CPU, {args.threads} threads)", run_hf))
            got = {}
            for what, fn in runs:
                if what.startswith("transformers"):  # nothing to compile: no untimed warm-up
                    first = float("nan")
                    t = common.best_time(fn, args.repeats)
                else:
                    first = common.timed_first_call(fn)
                    t = common.best_time(fn, args.repeats)
                got[what] = useful / t
                rows.append([tag, name, what, f"{useful / t:,.1f}", f"{t:.3f}", f"{first:.1f}"])
                common.log(rows[-1])
            key = f"{tag}_{name}"
            for what, tps in got.items():
                metrics[f"{key}_{what.split(' (')[0].replace(' ', '_')}_tokens_per_s"] = tps
            paged32 = got["paged engine (float32)"]
            metrics[f"{key}_paged_over_static"] = paged32 / got["static engine (float32)"]
            hf_names = [w for w in got if w.startswith("transformers")]
            if hf_names:
                metrics[f"{key}_paged_over_hf"] = paged32 / got[hf_names[0]]
            st = engines[None].stats
            per_row = args.page_size * st["pages_held"] / max(st["live_rows"], 1)
            dense = p_len + m
            kv_rows.append(
                [
                    tag,
                    name,
                    f"{per_row:.1f}",
                    f"{dense}",
                    f"{per_row * slot_bytes * 4 / 2**20:.3f}",
                    f"{dense * slot_bytes * 4 / 2**20:.3f}",
                ]
            )
            metrics[f"{key}_kv_slots_per_row_paged"] = per_row

    todo = {w.strip() for w in args.workloads.split(",")}
    a_n = args.a_prompts * args.a_group
    budgets = _lengths(args, rng)
    if "a" in todo:
        workload(
            "a",
            args.a_prompts,
            args.a_group,
            args.a_prompt_len,
            args.a_new_tokens,
            [args.a_new_tokens] * a_n,
            ["greedy", "sampling"],
            args.bf16,
        )
    if "b" in todo:
        workload(
            "b",
            args.b_prompts,
            args.b_group,
            args.b_prompt_len,
            args.b_new_tokens,
            budgets,
            ["sampling"],
            args.bf16_b,
        )

    body = [
        f"Model: {args.model} ({common.fmt_params(config.num_params())} parameters). "
        f"(a) {args.a_prompts} prompts × G={args.a_group}, {args.a_prompt_len}-token prompts, "
        f"{args.a_new_tokens} new tokens per row. (b) {args.b_prompts} prompts × "
        f"G={args.b_group}, {args.b_prompt_len}-token prompts, row lengths log-normal "
        f"(median {args.median:g}, σ {args.sigma:g}) in [1, {args.b_new_tokens}], "
        f"Σ = {sum(budgets)} tokens, max {max(budgets)}. Paged engine: {args.num_slots} slots, "
        f"pages of {args.page_size}, {args.chunk_steps} steps per chunk. Best of "
        f"{args.repeats} after a warm-up; tokens/s counts useful (forced-length) tokens.",
        "",
        *common.markdown_table(
            ["workload", "mode", "engine", "tokens/s", "seconds", "first call s"],
            rows,
            align="lllrrr",
        ),
        "",
        *[f"{k}: {v:.2f}×" for k, v in metrics.items() if "_over_" in k],
        "",
        "KV cache per live row (float32), paged (pages held / live rows, averaged over chunks) "
        "vs the dense cache:",
        "",
        *common.markdown_table(
            ["workload", "mode", "paged slots", "dense slots", "paged MiB", "dense MiB"],
            kv_rows,
            align="llrrrr",
        ),
    ]
    return common.report(
        args.out,
        __file__,
        argv,
        title="Rollout engines: static vs paged continuous batching vs transformers",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
