"""Scaling curves of the jitted sampler: generated tokens/s vs batch size, vs sequence length
and vs group size G, as markdown tables and PNG plots.

Every point is one ``jaxrl_llm.sampling.rollout`` call (prefill once per prompt + decode with a
KV cache, τ = 1 ancestral sampling as in GRPO rollouts, stop tokens disabled so every row runs
every step) on random prompt tokens. Each new shape compiles on its first call: that call is
timed on its own and reported as compile time (first call − best timed call); tokens/s is
rows · new tokens / the best of ``--repeats`` timed calls, prefill included.

  batch:   B prompts × G = 1, prompt ``--batch-prompt-len``, ``--new-tokens`` new tokens;
  seq:     ``--seq-rows`` prompts × G = 1, T = prompt + ``--new-tokens`` new tokens;
  group:   ``--group-prompts`` prompts × G samples (the prompt prefilled once, its cache shared).

  devices: the same GRPO run (``--devices-model``: D 256, 4 layers; 8 prompts × G 8, 64 new
           tokens) on 1 device and on N forced CPU devices with ``mesh.data=N``, for the static
           and the paged engine: the trainer's own ``time/rollout_s`` (median of the steps
           after the first, which compiles). The rows are the same, so a ratio near 1 means
           the rows are split over the devices; N× means every device decodes every row
           (issue 30). Each layout runs in a child process (the device count is fixed when
           JAX starts). ``--only devices`` runs just this curve.

Full run:    python tools/bench/bench_scaling.py --out tools/bench/results/scaling.md
Devices:     python tools/bench/bench_scaling.py --only devices --out tools/bench/results/rollout_devices.md
Smoke test:  python tools/bench/bench_scaling.py --model tiny --batch-sizes 1,2 --seq-lens 16,24 \
    --groups 1,2 --new-tokens 4 --batch-prompt-len 8 --repeats 1 --out /tmp/s.md
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# curve name -> (x-axis label, PNG file name)
CURVES = {
    "batch": ("batch size B (prompts, G = 1)", "scaling_batch.png"),
    "seq": ("sequence length T (prompt + generated tokens)", "scaling_seq.png"),
    "group": ("group size G (samples per prompt)", "scaling_group.png"),
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default=common.DEFAULT_MODEL,
        help="model alias/path for jaxrl_llm.interop.load_model, or 'tiny' (random)",
    )
    p.add_argument("--batch-sizes", type=_ints, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--batch-prompt-len", type=int, default=64)
    p.add_argument(
        "--seq-lens", type=_ints, default=[128, 256, 512, 1024], help="T = prompt + new tokens"
    )
    p.add_argument("--seq-rows", type=int, default=8)
    p.add_argument("--groups", type=_ints, default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--group-prompts", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2, help="timed calls per point (best kept)")
    p.add_argument("--only", choices=["curves", "devices", "all"], default="curves")
    p.add_argument("--devices", type=_ints, default=[1, 8], help="device counts (devices curve)")
    p.add_argument("--engines", default="static,paged", help="rollout engines (devices curve)")
    p.add_argument(
        "--axes",
        default="data",
        help="learner mesh axes the devices go on (devices curve): data, fsdp or both; the "
        "sampler's copy is laid out the same way for both (rollout.tensor: auto)",
    )
    p.add_argument("--devices-steps", type=int, default=4, help="GRPO steps per layout")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # "DEVICES,ENGINE"
    p.add_argument(
        "--plots-dir", default=None, help="where the PNGs go (default: the folder of --out)"
    )
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def _plot(path: str, xs, ys, *, xlabel: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.8), dpi=110)
    ax.plot(xs, ys, marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("generated tokens/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# The tiny GRPO run of issue 30's measurement: D 256, 4 layers, 8 prompts × G 8, 64 new tokens.
DEVICES_MODEL = dict(
    hidden_size=256,
    num_layers=4,
    num_heads=4,
    num_kv_heads=4,
    head_dim=64,
    intermediate_size=1024,
    vocab_size=259,
    max_position_embeddings=512,
)


def _child(args) -> int:
    """One layout: a GRPO run on ``n`` forced devices with ``mesh.data=n``; prints JSON."""
    import json
    import tempfile

    n, engine, axis = args.child.split(",")
    import jaxrl_llm

    with tempfile.TemporaryDirectory(prefix="bench_devices_") as out:
        jaxrl_llm.train(
            "configs/grpo.yaml",
            **{
                key.replace(".", "__"): value
                for key, value in {
                    "model.source": "tiny",
                    "model.tokenizer": "char",
                    "model.tiny": DEVICES_MODEL,
                    "output_dir": out,
                    "max_steps": args.devices_steps,
                    "mesh.data": int(n) if axis == "data" else 1,
                    "mesh.fsdp": int(n) if axis == "fsdp" else 1,
                    "rollout.engine": engine,
                    "rollout.prompts_per_step": 8,
                    "rollout.group_size": 8,
                    "rollout.max_new_tokens": 64,
                    "eval.every": 0,
                    "logging.plots": False,
                    "logging.tensorboard": False,
                    "checkpoint.save_every": 0,
                    "checkpoint.export_hf": False,
                }.items()
            },
        )
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    steps = [r for r in rows if r.get("time/rollout_s") is not None]
    print(
        "RESULT "
        + json.dumps(
            {
                "devices": int(n),
                "engine": engine,
                "axis": axis,
                "rollout_s": [r["time/rollout_s"] for r in steps],
                "update_s": [r.get("time/update_s") for r in steps],
                "tokens": [r.get("rollout/tokens_per_s") for r in steps],
            }
        )
    )
    return 0


def _devices_curve(args) -> tuple[list[str], dict]:
    """Run every (devices, engine) child; the rollout seconds table and its ratios."""
    import json
    import statistics
    import subprocess

    here = os.path.abspath(__file__)
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    res: dict[tuple[int, str, str], dict] = {}
    engines = [e for e in args.engines.split(",") if e]
    axes = [a for a in args.axes.split(",") if a]
    layouts = [(n, a) for n in args.devices for a in axes if n > 1 or a == axes[0]]
    for engine in engines:
        for n, axis in layouts:
            env = dict(os.environ)
            flags = env.get("XLA_FLAGS", "")
            env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
            env["JAX_PLATFORMS"] = "cpu"
            # the children import this checkout's jaxrl_llm (not an installed copy)
            env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
            cmd = [sys.executable, here, "--child", f"{n},{engine},{axis}"]
            cmd += ["--devices-steps", str(args.devices_steps)]
            done = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
            lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
            if done.returncode or not lines:
                raise RuntimeError(
                    f"devices={n} axis={axis} engine={engine} failed:\n{done.stderr[-3000:]}"
                )
            r = json.loads(lines[-1][len("RESULT ") :])
            r["median_s"] = statistics.median(r["rollout_s"][1:])  # the first step compiles
            r["median_update_s"] = statistics.median(r["update_s"][1:])
            res[(n, engine, axis)] = r
            common.log(
                f"{engine} on {n} device(s) ({axis}): rollout {r['median_s']:.3f} s "
                f"(steps {', '.join(f'{x:.2f}' for x in r['rollout_s'])})"
            )
    base = layouts[0]
    rows, metrics = [], {}
    for engine in engines:
        for n, axis in layouts:
            r = res[(n, engine, axis)]
            ratio = r["median_s"] / res[(base[0], engine, base[1])]["median_s"]
            rows.append(
                [
                    engine,
                    n,
                    axis,
                    f"{r['median_s']:.3f}",
                    f"{ratio:.2f}×",
                    f"{r['median_update_s']:.3f}",
                    ", ".join(f"{x:.2f}" for x in r["rollout_s"]),
                ]
            )
            key = f"{n}" if axis == "data" else f"{n}_{axis}"
            metrics[f"devices_{engine}_{key}_rollout_s"] = r["median_s"]
            metrics[f"devices_{engine}_{key}_ratio"] = ratio
    body = [
        "",
        f"**Rollout time vs devices** — GRPO on a random model "
        f"({', '.join(f'{k} {v}' for k, v in DEVICES_MODEL.items())}), 8 prompts × "
        f"G 8, 64 new tokens, the learner's `mesh.<axis>` = the device count (forced CPU "
        f"devices), {args.devices_steps} steps; `time/rollout_s` is the median of the steps "
        f"after the first (which compiles); the ratio is against {base[0]} device(s) "
        f"({base[1]}).",
        "",
        *common.markdown_table(
            ["engine", "devices", "axis", "rollout (s)", "ratio", "update (s)", "every step (s)"],
            rows,
            align="lrlrrrl",
        ),
    ]
    return body, metrics


def main(argv=None) -> int:
    args = _parse(argv)
    if args.child:
        return _child(args)
    if args.only == "devices":
        body, metrics = _devices_curve(args)
        return common.report(
            args.out,
            __file__,
            argv,
            title="Rollout time vs devices (issue 30)",
            body=body,
            metrics=metrics,
        )
    import jax

    from jaxrl_llm.sampling import SamplingConfig, pad_prompts, rollout

    config, params, _ = common.load_model(args.model)
    sampling = SamplingConfig(temperature=1.0, use_model_eos=False)
    rng = np.random.default_rng(0)
    low = 3 if config.vocab_size > 3 else 0
    m = args.new_tokens

    def point(b: int, g: int, p_len: int) -> dict[str, float]:
        prompts = [rng.integers(low, config.vocab_size, size=p_len).tolist() for _ in range(b)]
        tokens, mask = pad_prompts(prompts, length=p_len)
        run = lambda: jax.block_until_ready(
            rollout(
                params,
                tokens,
                mask,
                config=config,
                sampling=sampling,
                num_samples=g,
                max_new_tokens=m,
                gen_len=m,
            ).tokens
        )
        first = common.timed_first_call(run)
        best = common.best_time(run, args.repeats)
        out = {
            "rows": b * g,
            "prompt_len": p_len,
            "seconds": best,
            "tokens_per_s": b * g * m / best,
            "compile_s": max(first - best, 0.0),
        }
        common.log(
            f"B={b} G={g} P={p_len} M={m}: {out['tokens_per_s']:,.1f} tokens/s, "
            f"compile {out['compile_s']:.1f} s"
        )
        return out

    curves: dict[str, list[tuple[int, dict]]] = {
        "batch": [(b, point(b, 1, args.batch_prompt_len)) for b in args.batch_sizes],
        "seq": [(t, point(args.seq_rows, 1, t - m)) for t in args.seq_lens if t > m],
        "group": [(g, point(args.group_prompts, g, args.batch_prompt_len)) for g in args.groups],
    }
    plots_dir = args.plots_dir or (os.path.dirname(os.path.abspath(args.out)) if args.out else None)
    if plots_dir and not common.have("matplotlib"):
        common.log("no PNG plots: matplotlib is not installed (pip install -e .[dev])")
        plots_dir = None
    desc = {
        "batch": f"B prompts × G = 1, {args.batch_prompt_len}-token prompts, {m} new tokens",
        "seq": f"{args.seq_rows} prompts × G = 1, T − {m}-token prompts, {m} new tokens",
        "group": f"{args.group_prompts} prompts × G, {args.batch_prompt_len}-token prompts, "
        f"{m} new tokens (prefix shared)",
    }
    head = {"batch": "B", "seq": "T", "group": "G"}
    n_params = config.num_params()
    body = [
        f"Model: {args.model} ({common.fmt_params(n_params)} parameters, "
        f"{config.param_dtype}); τ = 1 sampling, stop tokens disabled; tokens/s = generated "
        f"tokens / best of {args.repeats} timed calls (prefill included) after a compiling "
        f"first call.",
    ]
    metrics: dict[str, object] = {}
    dev = jax.devices()[0]
    for name, pts in curves.items():
        xlabel, png = CURVES[name]
        if not pts:
            continue
        xs = [x for x, _ in pts]
        ys = [p["tokens_per_s"] for _, p in pts]
        body += ["", f"**Tokens/s vs {xlabel}** — {desc[name]}.", ""]
        body += common.markdown_table(
            [head[name], "rows", "prompt + new", "tokens/s", "seconds", "compile (s)"],
            [
                [
                    x,
                    p["rows"],
                    f"{p['prompt_len']} + {m}",
                    f"{p['tokens_per_s']:,.1f}",
                    f"{p['seconds']:.3f}",
                    f"{p['compile_s']:.1f}",
                ]
                for x, p in pts
            ],
            align="rrrrrr",
        )
        if plots_dir:
            os.makedirs(plots_dir, exist_ok=True)
            _plot(
                os.path.join(plots_dir, png),
                xs,
                ys,
                xlabel=xlabel,
                title=f"{args.model} on {dev.platform} ({dev.device_kind})\n{desc[name]}",
            )
            body += ["", f"![tokens/s vs {xlabel}]({png})"]
        best = int(np.argmax(ys))
        metrics[f"{name}_x"] = xs
        metrics[f"{name}_tokens_per_s"] = ys
        metrics[f"{name}_best_x"] = xs[best]
        metrics[f"{name}_best_tokens_per_s"] = ys[best]
    if args.only == "all":
        more, more_metrics = _devices_curve(args)
        body += more
        metrics.update(more_metrics)
    return common.report(
        args.out,
        __file__,
        argv,
        title="Sampler scaling: tokens/s vs batch, sequence length, G",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
