"""Where one GRPO step's time goes: rollout (generation), reward, reference log-probs, update.

Runs the real online loop (``jaxrl_llm.train.online.trainer.OnlineTrainer``) on the main job's config
(``configs/grpo_smollm2_addition.yaml``, the real model by default) and times its steps after
``--warmup`` steps that compile everything. The trainer measures its phases with wall-clock
timers around host-synchronising calls (the rollout is copied to the host, the reference
log-probs are read back, the update's metrics are fetched), logged as ``time/rollout_s``,
``time/reference_s``, ``time/update_s`` and ``time/step_s``; the reward functions' share of the
rollout phase is timed here by wrapping the trainer's reward set. Old log-probs cost nothing
extra: the sampler records them while generating.

The main job runs with β = 0 (no reference model); this benchmark sets ``loss.kl_coef`` to
``--kl-coef`` (default 0.04, the GRPO paper's β) so the reference forward is part of the step.
Pass ``--kl-coef 0`` for the main job's exact step.

Full run:    python tools/bench/bench_grpo_split.py --out tools/bench/results/grpo_split.md
Smoke test:  python tools/bench/bench_grpo_split.py --model tiny --steps 1 \
    --set rollout.prompts_per_step=2 --set rollout.group_size=2 --out /tmp/g.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# (key in the report's metrics, label, what the phase covers)
PHASES = (
    (
        "generation_s",
        "rollout: generation",
        "prefill + decode (jitted sampler, old log-probs recorded), copy to host, detokenise",
    ),
    ("reward_s", "reward", "the config's reward functions on the decoded texts"),
    ("reference_s", "reference log-probs", "frozen reference forward (β > 0 only)"),
    ("update_s", "update", "epochs × minibatches jitted train steps"),
    ("other_s", "other", "advantages, batch assembly, bookkeeping"),
)


class TimedRewards:
    """Wraps a callable reward set and adds up the seconds spent in it."""

    def __init__(self, inner):
        self.inner = inner
        self.seconds = 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(self.inner, name)


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
    p.add_argument("--steps", type=int, default=3, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (compilation)")
    p.add_argument("--kl-coef", type=float, default=0.04, help="β (loss.kl_coef)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra dotted config override (repeatable)",
    )
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    from jaxrl_llm.train.config.config_io import load_config
    from jaxrl_llm.train.config.run_config import RunConfig
    from jaxrl_llm.train.online.trainer import OnlineTrainer

    overrides = (
        common.online_run_overrides(args.model, kl_coef=args.kl_coef, prefix="bench_grpo_")
        + [f"max_steps={args.warmup + args.steps}"]
        + list(args.overrides)
    )
    cfg = load_config(RunConfig, args.config, overrides)
    r = cfg.rollout
    trainer = OnlineTrainer(cfg, log_stream=sys.stderr)
    rewards = TimedRewards(trainer.rollouts.rewards)
    trainer.rollouts.rewards = rewards
    per_step: list[dict[str, float]] = []
    first_step_s = 0.0
    try:
        for step in range(1, args.warmup + args.steps + 1):
            rewards.seconds = 0.0
            m = trainer.train_step(step)
            missing = [k for k in ("time/rollout_s", "time/update_s", "time/step_s") if k not in m]
            if missing:
                raise SystemExit(
                    f"OnlineTrainer.train_step no longer reports {missing}; the "
                    f"time split needs its per-phase wall-clock metrics"
                )
            if step == 1:
                first_step_s = m["time/step_s"]
            common.log(
                f"step {step}: "
                + ", ".join(f"{k}={v:.3f}" for k, v in m.items() if k.startswith("time/"))
            )
            if step <= args.warmup:
                continue
            phases = {
                "generation_s": m["time/rollout_s"] - rewards.seconds,
                "reward_s": rewards.seconds,
                "reference_s": m.get("time/reference_s", 0.0),
                "update_s": m["time/update_s"],
            }
            phases["other_s"] = m["time/step_s"] - sum(phases.values())
            phases["step_s"] = m["time/step_s"]
            phases["completion_length"] = m.get("completion/length_mean", float("nan"))
            per_step.append(phases)
    finally:
        trainer.close()

    med = {k: float(np.median([s[k] for s in per_step])) for k in per_step[0]}
    step_s = med["step_s"]
    rows = []
    for key, label, note in PHASES:
        if key == "reference_s" and args.kl_coef == 0:
            note = "β = 0: no reference model, skipped"
        rows.append([label, f"{med[key]:.3f}", f"{100 * med[key] / step_s:.1f}%", note])
    rows.append(
        [
            "**step**",
            f"**{step_s:.3f}**",
            "100%",
            f"first step (with compilation): {first_step_s:.1f} s",
        ]
    )
    n = r.prompts_per_step * r.group_size
    body = [
        f"Config: `{os.path.relpath(args.config, common.ROOT)}` with model.source="
        f"{'tiny (random, character tokenizer)' if args.model == common.TINY else args.model}, "
        f"β = loss.kl_coef = {args.kl_coef:g}"
        + (f", overrides {' '.join(args.overrides)}" if args.overrides else "")
        + ". "
        f"{r.prompts_per_step} prompts × G={r.group_size} = {n} rows, up to {r.max_new_tokens} "
        f"new tokens (mean {med['completion_length']:.1f}), {r.epochs} epoch(s) × {r.minibatches} "
        f"minibatch(es). Median of {args.steps} step(s) after {args.warmup} warm-up step(s).",
        "",
        *common.markdown_table(["phase", "seconds", "share", "what"], rows, align="lrrl"),
    ]
    metrics = dict(med, first_step_s=first_step_s, rows=n, kl_coef=args.kl_coef)
    return common.report(
        args.out,
        __file__,
        argv,
        title="GRPO step time split (jaxrl_llm.train.online.trainer)",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
