"""The GRPO update with zero-advantage groups skipped, against the whole-batch update.

A group whose rewards are all equal has zero advantages and adds nothing to the policy
gradient (β = 0, no entropy bonus). With ``rollout.skip_zero_advantage`` the train step runs
micro-batches of ``rollout.micro_batch_groups`` whole groups and skips those with no nonzero
advantage (``jaxrl_llm.losses.policy_gradient_zero_batch``); the update is the same.

This benchmark builds the main job's trainer (``configs/grpo_smollm2_addition.yaml``, the real
model by default), draws one real rollout batch, and times the jitted update on it with the
first k of the step's groups given nonzero advantages (the rest zero), for several k and for
each micro-batch size, side by side with the whole-batch update (``skip_zero_advantage=false``).
The best of ``--repeats`` calls is reported, after one call that compiles.

Full run:    python tools/bench/bench_update_skip.py --out tools/bench/results/update_skip.md
Smoke test:  python tools/bench/bench_update_skip.py --model tiny --repeats 1 --out /tmp/u.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--config", default=os.path.join(common.ROOT, "configs", "grpo_smollm2_addition.yaml")
    )
    p.add_argument(
        "--model",
        default=common.DEFAULT_MODEL,
        help="model.source (an alias/path), or 'tiny' (random, character tokenizer)",
    )
    p.add_argument(
        "--micro-batch-groups",
        default="1,2,4",
        help="comma-separated rollout.micro_batch_groups values to time",
    )
    p.add_argument("--repeats", type=int, default=2, help="timed calls per cell (best kept)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    import jax

    from jaxrl_llm.train.config.config_io import load_config
    from jaxrl_llm.train.config.run_config import RunConfig
    from jaxrl_llm.train.online.experience import rl_batch
    from jaxrl_llm.train.online.learner import skippable_layout
    from jaxrl_llm.train.online.trainer import OnlineTrainer

    base = common.online_run_overrides(args.model, kl_coef=0.0, prefix="bench_skip_")
    mbgs = [int(x) for x in args.micro_batch_groups.split(",")]
    settings = [("whole batch", ["rollout.skip_zero_advantage=false"])] + [
        (f"skip, {k} group(s) per micro-batch", [f"rollout.micro_batch_groups={k}"]) for k in mbgs
    ]

    cfg0 = load_config(RunConfig, args.config, base)
    first = OnlineTrainer(cfg0, log_stream=sys.stderr)
    policy = first.policy
    rb, _ = first.rollouts.collect(first.iterator, 1)
    r = cfg0.rollout
    g, n_groups = r.group_size, r.prompts_per_step
    n = g * n_groups
    rng = np.random.default_rng(0)
    adv_all = rng.standard_normal(n).astype(np.float32)
    ks = sorted({1, max(1, n_groups * 3 // 8), max(1, n_groups * 5 // 8), n_groups})
    results: dict[str, dict[int, float]] = {}
    micro: dict[str, int] = {}
    trainers = [first]
    try:
        for label, over in settings:
            cfg = load_config(RunConfig, args.config, base + over)
            trainer = OnlineTrainer(cfg, policy=policy, log_stream=sys.stderr)
            trainers.append(trainer)
            m = trainer.plan.rows.micro_batches
            micro[label] = m
            frozen = policy.frozen()
            results[label] = {}
            for k in ks:
                adv = np.where(np.arange(n) < k * g, adv_all, 0.0).astype(np.float32)
                batch = rl_batch(rb, adv, np.ones(n, np.int32))
                if m > 1:
                    batch = skippable_layout(batch, g, m)

                def call():
                    policy.state, metrics = trainer.step_fn(policy.state, batch, frozen)
                    return jax.device_get(metrics)

                t0 = time.perf_counter()
                call()  # compile (first k) / warm
                common.log(
                    f"{label}, {k} informative groups: first call {time.perf_counter() - t0:.1f} s"
                )
                results[label][k] = common.best_time(call, args.repeats)
                common.log(f"  best of {args.repeats}: {results[label][k]:.3f} s")
    finally:
        for t in trainers:
            t.close()

    whole = results["whole batch"]
    header = ["update", "micro-batches"] + [f"{k}/{n_groups} groups informative" for k in ks]
    rows = []
    for label, _ in settings:
        cells = [
            f"{results[label][k]:.3f} s"
            + ("" if label == "whole batch" else f" ({whole[k] / results[label][k]:.2f}×)")
            for k in ks
        ]
        rows.append([label, micro[label]] + cells)
    body = [
        f"Config: `{os.path.relpath(args.config, common.ROOT)}` with model.source="
        f"{'tiny' if args.model == common.TINY else args.model}, β = 0, "
        f"{n_groups} prompts × G = {g} ({n} rows), one real rollout batch (completion "
        f"length {float(np.mean(np.asarray(rb.rollout.lengths))):.1f} tokens). The first k "
        f"groups get nonzero advantages, the rest zero; seconds per jitted update (forward, "
        f"backward, optimizer), best of {args.repeats}; (×) = whole batch / this.",
        "",
        *common.markdown_table(header, rows),
    ]
    common.write_report(
        args.out,
        title="GRPO update: skipping zero-advantage groups",
        command=common.command_line(__file__, argv),
        body=body,
        metrics={
            "results": {k: {str(kk): v for kk, v in d.items()} for k, d in results.items()},
            "micro_batches": micro,
            "groups": n_groups,
            "group_size": g,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
