"""Asynchronous rollouts against a slow reward (issue 18): the main job's task
(configs/grpo_smollm2_addition.yaml) with a reward service that answers each completion after
``--latency`` seconds, one request at a time (a sleep standing in for a remote scorer), run
synchronously and with ``rollout.max_staleness`` 1 and 2, side by side in one command; then the
main job itself (no latency), synchronous vs k = 1. Reported: seconds per step after the first
(compiles), steps per minute, their ratio to the synchronous run, the async wait, and the
held-out greedy accuracy after the same number of steps (200 prompts, the plain reward).

Each run is a fresh ``jaxrl-llm train`` process; the held-out evaluation runs once at the end
of each (``eval.before: false``). The slow reward only sleeps on training batches (calls with
exactly ``prompts_per_step × group_size`` completions): evaluation cost is the same in every
mode and outside the step times.

Full run:   python tools/bench/bench_async.py --out tools/bench/results/async.md
Smoke test: python tools/bench/bench_async.py --model tiny --steps 3 --latency 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CONFIG = os.path.join(common.ROOT, "configs", "grpo_smollm2_addition.yaml")
# Steps timed: from the 4th on. Step 1 compiles, and while it does the producer of a k = 2 run
# samples steps 2 and 3 ahead; timing from step 4 compares steady states.
SKIP = 3


def slow_math_answer(prompts, completions, *, latency: float = 0.5, batch: int = 32, **fields):
    """``math_answer`` (not strict) after ``latency`` s per completion, one at a time, on calls
    of exactly ``batch`` completions (training batches); other calls are not slowed."""
    from jaxrl_llm.rewards.math_answer import math_answer_reward

    if len(completions) == batch:
        time.sleep(latency * len(completions))
    return math_answer_reward(prompts, completions, **fields)


def run(args, name: str, overrides: list[str], latency: float) -> dict:
    out = tempfile.mkdtemp(prefix=f"bench_async_{name}_")
    rows = 8 * 4  # the main job's prompts_per_step × group_size
    source = (
        ["model.source=tiny", "model.tokenizer=char"]
        if args.model == common.TINY
        else [f"model.source={args.model}"]
    )
    rewards = (
        "rewards=[{name: 'tools.bench.bench_async:slow_math_answer', kwargs: "
        f"{{latency: {latency}, batch: {rows}}}}}]"
        if latency
        else "rewards=[{name: math_answer, kwargs: {strict: false}}]"
    )
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "jaxrl-llm"),
        "train",
        CONFIG,
        *source,
        f"output_dir={out}",
        f"max_steps={args.steps}",
        "eval.every=0",
        "eval.before=false",
        "checkpoint.export_hf=false",
        "logging.tensorboard=false",
        "logging.plots=false",
        rewards,
        *overrides,
    ]
    common.log(f"{name}: {' '.join(cmd[2:])}")
    env = dict(os.environ, PYTHONPATH=common.ROOT)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=common.ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"{name} failed")
    steps = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    train = [r for r in steps if r.get("time/step_s") is not None]
    key = "eval/" + ("tools.bench.bench_async:slow_math_answer" if latency else "math_answer")
    acc = next((r[key] for r in reversed(steps) if r.get(key) is not None), None)
    later = [r["time/step_s"] for r in train[SKIP:]]
    res = {
        "name": name,
        "step_s": statistics.median(later),
        "mean_step_s": statistics.fmean(later),
        "wait_s": statistics.fmean([r.get("async/wait_s") or 0.0 for r in train[SKIP:]]),
        "reward_s": statistics.fmean([r.get("time/reward_s") or 0.0 for r in train[SKIP:]]),
        "accuracy": acc,
        "reward_mean": statistics.fmean([r["reward/mean"] for r in train]),
        "wall_s": wall,
    }
    common.log(f"{name}: {res}")
    shutil.rmtree(out, ignore_errors=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=common.DEFAULT_MODEL, help="alias/path or 'tiny'")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--latency", type=float, default=0.5, help="seconds per completion scored")
    p.add_argument(
        "--only",
        default=None,
        help="comma-separated run names to make (e.g. 'k=1'); speed-ups need their sync run",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.steps <= SKIP:
        raise SystemExit(f"--steps must be > {SKIP} (the first {SKIP} steps are not timed)")

    runs = [
        ("sync", [], args.latency),
        ("k=1", ["rollout.max_staleness=1"], args.latency),
        ("k=2", ["rollout.max_staleness=2"], args.latency),
        ("sync, no latency", [], 0.0),
        ("k=1, no latency", ["rollout.max_staleness=1"], 0.0),
    ]
    if args.only:
        names = [n.strip() for n in args.only.split(",")]
        unknown = set(names) - {r[0] for r in runs}
        if unknown:
            raise SystemExit(
                f"--only: unknown runs {sorted(unknown)}; known: {[r[0] for r in runs]}"
            )
        runs = [r for r in runs if r[0] in names]
    res = [run(args, *r) for r in runs]
    by_name = {r["name"]: r for r in res}
    table = []
    metrics = {}
    for r in res:
        ref = by_name.get("sync" if "no latency" not in r["name"] else "sync, no latency")
        speed = None if ref is None else ref["mean_step_s"] / r["mean_step_s"]
        table.append(
            [
                r["name"],
                f"{r['step_s']:.1f} s",
                f"{60 / r['mean_step_s']:.2f}",
                "—" if speed is None else f"{speed:.2f}×",
                f"{r['wait_s']:.1f} s",
                f"{r['reward_mean']:.3f}",
                "—" if r["accuracy"] is None else f"{r['accuracy']:.3f}",
                f"{r['wall_s'] / 60:.1f} min",
            ]
        )
        if speed is not None:
            metrics[f"speedup_{r['name'].replace(', ', '_').replace(' ', '_')}"] = speed
    body = [
        f"{args.model}, the main job's config, {args.steps} steps per run; reward latency "
        f"{args.latency} s per completion of a training batch (32 per step, in series: "
        f"{32 * args.latency:.0f} s per step). Step times are over steps {SKIP + 1}–{args.steps} "
        "(step 1 compiles; a k = 2 producer samples steps 2–3 meanwhile); speed-up = the synchronous run's mean step time / this run's "
        "(each group against its own synchronous run). Accuracy: greedy, 200 held-out prompts, "
        f"after step {args.steps}.",
        "",
        *common.markdown_table(
            [
                "run",
                "median step",
                "steps / min",
                "speed-up",
                "async wait / step",
                "train reward (mean)",
                f"held-out accuracy @ {args.steps}",
                "whole command",
            ],
            table,
        ),
    ]
    return common.report(
        args.out,
        __file__,
        argv,
        title="Asynchronous rollouts against a slow reward",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
