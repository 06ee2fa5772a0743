"""Decode throughput of jaxrl_llm.sampling vs transformers' generate and the compute roofline.

Measures, in one run, on the machine it runs on:
  1. our tokens/s (greedy and sampling) for B prompts × G samples (prefix shared);
  2. transformers ``generate`` on the same B·G rows (torch, same thread count);
  3. the compute roofline: 2 · parameters · rows FLOPs per decode step over a measured
     float32 jnp matmul rate (a square matmul, and the skinny [rows, D] × [D, V] one);
  4. prompt prefix sharing vs repeated prefill (long prompts, large G).
Prints a markdown table and writes it (with the exact command and a machine description)
to --out.

Full run (the lead's):  python tools/bench/bench_decode.py --out tools/bench/results/decode.md
Smoke test (seconds):   python tools/bench/bench_decode.py --model tiny --prompts 2 --group 2 \
    --prompt-len 8 --new-tokens 8 --prefix-prompt-len 16 --prefix-group 2 --out /tmp/d.md
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="model alias/path for jaxrl_llm.interop.load_model, or 'tiny' (random)")
    p.add_argument("--prompts", type=int, default=4, help="B prompts")
    p.add_argument("--group", type=int, default=8, help="G samples per prompt")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prefix-prompts", type=int, default=2)
    p.add_argument("--prefix-prompt-len", type=int, default=512)
    p.add_argument("--prefix-group", type=int, default=16)
    p.add_argument("--prefix-new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2, help="timed repetitions (best is kept)")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="torch threads (XLA's CPU client uses every core)")
    p.add_argument("--skip-hf", action="store_true", help="skip transformers generate")
    p.add_argument("--out", default=None, help="write the markdown report here")
    return p.parse_args(argv)


def _best(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _machine() -> str:
    import jax
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch
        tv = torch.__version__
    except ImportError:
        tv = "not installed"
    devs = jax.devices()
    return (f"{platform.platform()}; CPU: {cpu}; {os.cpu_count()} logical cores; "
            f"jax {jax.__version__} on {devs[0].platform} ({len(devs)} device(s), "
            f"{devs[0].device_kind}); torch {tv}; python {platform.python_version()}")


def _matmul_rate(m, k, n, repeats=5):
    import jax
    import jax.numpy as jnp
    a = jax.random.normal(jax.random.PRNGKey(0), (m, k), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (k, n), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    f(a, b).block_until_ready()
    t = _best(lambda: f(a, b).block_until_ready(), repeats)
    return 2.0 * m * k * n / t


def main(argv=None) -> int:
    args = _parse(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl_llm.models import ModelConfig, init_params
    from jaxrl_llm.sampling import (SamplingConfig, init_decode_state, pad_prompts, prefill,
                                    rollout)

    log = lambda *a: print(*a, file=sys.stderr, flush=True)
    if args.model == "tiny":
        config = ModelConfig.tiny(eos_token_ids=(2,), pad_token_id=0)
        params = init_params(config, jax.random.PRNGKey(0))
    else:
        from jaxrl_llm.interop import load_model
        config, params, _ = load_model(args.model)
    n_params = config.num_params()
    b, g, p_len, m = args.prompts, args.group, args.prompt_len, args.new_tokens
    n = b * g
    log(f"model {args.model}: {n_params / 1e6:.1f}M params; B={b} G={g} P={p_len} M={m}")

    rng = np.random.default_rng(0)
    low = 3 if config.vocab_size > 3 else 0
    prompts = [rng.integers(low, config.vocab_size, size=p_len).tolist() for _ in range(b)]
    tokens, mask = pad_prompts(prompts, length=p_len)
    rows = []  # (what, tokens/s, seconds, note)

    # Every row runs all M steps: stop tokens are disabled so throughput is comparable.
    modes = {
        "greedy": SamplingConfig(greedy=True, use_model_eos=False),
        "sampling (τ=1, top-p 0.95)": SamplingConfig(temperature=1.0, top_p=0.95,
                                                     use_model_eos=False),
    }
    for name, s in modes.items():
        run = lambda: rollout(params, tokens, mask, config=config, sampling=s, num_samples=g,
                              max_new_tokens=m, gen_len=m).tokens.block_until_ready()
        t0 = time.perf_counter()
        run()
        compile_s = time.perf_counter() - t0
        t = _best(run, args.repeats)
        rows.append((f"jaxrl_llm {name}", n * m / t, t,
                     f"prefill + decode, first call {compile_s:.1f}s incl. compile"))
        log(rows[-1])

    if not args.skip_hf:
        import torch
        from transformers import AutoModelForCausalLM
        torch.set_num_threads(args.threads)
        if args.model == "tiny":
            from jaxrl_llm.interop import export_hf
            hf_dir = tempfile.mkdtemp()
            export_hf(hf_dir, config=config, params=params)
        else:
            from jaxrl_llm.interop import cached_gguf_dir, resolve_alias
            hf_dir = cached_gguf_dir(resolve_alias(args.model)) \
                if not os.path.exists(args.model) else args.model
        hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), local_files_only=True,
                                                  dtype=torch.float32).eval()
        ids = torch.tensor(np.repeat(tokens, g, axis=0), dtype=torch.long)
        am = torch.ones_like(ids)
        for name, kw in {"greedy": dict(do_sample=False),
                         "sampling (τ=1, top-p 0.95)": dict(do_sample=True, temperature=1.0,
                                                            top_p=0.95, top_k=0)}.items():
            def run_hf():
                with torch.no_grad():
                    hf.generate(ids, attention_mask=am, max_new_tokens=m, min_new_tokens=m,
                                pad_token_id=config.pad_token_id or 0, **kw)
            run_hf()  # warm-up
            t = _best(run_hf, args.repeats)
            rows.append((f"transformers generate {name}", n * m / t, t,
                         f"torch {torch.__version__}, {args.threads} threads, {n} rows "
                         "(prompt repeated G times)"))
            log(rows[-1])

    # Compute roofline: a decode step costs ≈ 2 · params · rows FLOPs (attention excluded).
    big = _matmul_rate(1024, 1024, 1024)
    skinny = _matmul_rate(n, config.hidden_size, config.vocab_size)
    for label, rate in [("square 1024³ matmul", big),
                        (f"skinny [{n}, {config.hidden_size}]×[{config.hidden_size}, "
                         f"{config.vocab_size}] matmul", skinny)]:
        step = 2.0 * n_params * n / rate
        rows.append((f"roofline ({label}: {rate / 1e9:.1f} GFLOP/s)", n / step, step * m,
                     f"2·{n_params / 1e6:.1f}M·{n} FLOPs per step"))

    # Prefix sharing vs repeated prefill.
    pb, pg, pl, pm = args.prefix_prompts, args.prefix_group, args.prefix_prompt_len, \
        args.prefix_new_tokens
    long_prompts = [rng.integers(low, config.vocab_size, size=pl).tolist() for _ in range(pb)]
    lt, lm = pad_prompts(long_prompts, length=pl)
    rt, rmask = np.repeat(lt, pg, axis=0), np.repeat(lm, pg, axis=0)
    greedy = SamplingConfig(greedy=True, use_model_eos=False)

    def shared_prefill():
        logits, cache, pos = prefill(params, lt, lm, config=config, cache_len=pl + pm)
        st = init_decode_state(logits, cache, pos, jnp.arange(pb), seed=0, num_samples=pg,
                               gen_len=pm, max_new_tokens=pm)
        jax.block_until_ready(st)

    def repeated_prefill():
        logits, cache, pos = prefill(params, rt, rmask, config=config, cache_len=pl + pm)
        st = init_decode_state(logits, cache, pos, jnp.arange(pb * pg), seed=0, num_samples=1,
                               gen_len=pm, max_new_tokens=pm)
        jax.block_until_ready(st)

    def shared_e2e():
        rollout(params, lt, lm, config=config, sampling=greedy, num_samples=pg,
                max_new_tokens=pm, gen_len=pm).tokens.block_until_ready()

    def repeated_e2e():
        rollout(params, rt, rmask, config=config, sampling=greedy, num_samples=1,
                max_new_tokens=pm, gen_len=pm).tokens.block_until_ready()

    prefix_rows = []
    for label, fn in [("prefill, prefix shared (B rows, cache repeated G×)", shared_prefill),
                      ("prefill, repeated prompts (B·G rows)", repeated_prefill),
                      (f"prefill + {pm} tokens, prefix shared", shared_e2e),
                      (f"prefill + {pm} tokens, repeated prompts", repeated_e2e)]:
        fn()
        t = _best(fn, args.repeats)
        prefix_rows.append((label, t))
        log(label, t)

    cmd = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0])] + sys.argv[1:]) \
        if argv is None else " ".join(shlex.quote(a) for a in ["tools/bench/bench_decode.py"] + argv)
    lines = [
        "## Decode throughput (jaxrl_llm.sampling)",
        "",
        f"Command: `python {cmd}`",
        "",
        f"Machine: {_machine()}",
        "",
        f"Model: {args.model} ({n_params / 1e6:.1f}M parameters, float32); B={b} prompts × "
        f"G={g} samples = {n} rows; {p_len}-token prompts; {m} new tokens per row (stop "
        f"tokens disabled). Best of {args.repeats} timed runs after a warm-up.",
        "",
        "| what | tokens/s | seconds | note |",
        "|---|---:|---:|---|",
    ]
    lines += [f"| {w} | {tps:,.1f} | {s:.3f} | {note} |" for w, tps, s, note in rows]
    lines += [
        "",
        f"Prefix sharing: {pb} prompts × {pl} tokens, G={pg} ({pb * pg} rows).",
        "",
        "| what | seconds |",
        "|---|---:|",
    ]
    lines += [f"| {w} | {s:.3f} |" for w, s in prefix_rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
