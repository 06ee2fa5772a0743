"""The online learner's update on packed rows against padded rows (issue 22 §4).

``logprobs.pack`` packs each update's episodes (prompt + completion, real tokens only) into
rows with segment ids (``jaxrl_llm.data.pack_rl_batch``) instead of one left-padded row each;
the loss and gradient are the padded ones (tests/losses/test_packed.py). This benchmark builds
the main job's trainer (``configs/grpo_smollm2_addition.yaml``, the real model and its LoRA
adapters by default) and times ``Learner.update`` — host-side packing, forward, backward and
optimizer — on the same batches, padded and packed, side by side:

- main job: real rollout batches of the main job (8 prompts × G = 4, 16 new tokens), with its
  zero-advantage skipping (micro-batches of one group);
- long tail: the main job's prompts with completions whose lengths are drawn from a log-normal
  (median ``--median``, σ = 1, at most ``--max-new`` tokens; random tokens, nonzero
  advantages: nothing skipped), the reasoning-RL length mix.

Reported: seconds per update (best of ``--repeats`` after one call that compiles), real
tokens per second (tokens with attention mask 1) and the packed/padded ratio, and the packed
rows' fill (real tokens / token slots).

Full run:    python tools/bench/bench_packing.py --out tools/bench/results/packing.md
Smoke test:  python tools/bench/bench_packing.py --model tiny --repeats 1 --max-new 64
"""

from __future__ import annotations

import argparse
import copy
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
    p.add_argument("--batches", type=int, default=2, help="real main-job rollout batches")
    p.add_argument("--max-new", type=int, default=512, help="long tail: longest completion")
    p.add_argument("--median", type=float, default=60.0, help="long tail: median completion")
    p.add_argument("--long-prompts", type=int, default=4, help="long tail: prompts (× G = 4)")
    p.add_argument("--repeats", type=int, default=2, help="timed calls per cell (best kept)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def _time_update(learner, policy, batch, repeats: int) -> tuple[float, dict]:
    """(best seconds of ``repeats`` updates after a compiling one, the last metrics)."""
    import jax

    out: dict = {}

    def call():
        out.update(learner.update(policy, batch, 1, frozen=policy.frozen()))
        jax.block_until_ready(policy.state.params)

    t0 = time.perf_counter()
    call()
    common.log(f"  first call {time.perf_counter() - t0:.1f} s")
    return common.best_time(call, repeats), out


def _long_tail(batch: dict, rng, *, groups: int, g: int, max_new: int, median: float, vocab: int):
    """The first ``groups`` prompts of a main-job batch with long-tailed completions."""
    t0 = batch["input_ids"].shape[1]
    prompt_cols = t0 - int(batch["completion_width"])
    rows = np.arange(groups * g)
    p_ids = batch["input_ids"][rows, :prompt_cols]
    p_attn = batch["attention_mask"][rows, :prompt_cols]
    n = len(rows)
    lengths = np.clip(np.round(rng.lognormal(np.log(median), 1.0, n)), 1, max_new).astype(int)
    cols = np.arange(max_new)[None, :]
    c_mask = (cols < lengths[:, None]).astype(np.int32)
    c_ids = rng.integers(3, vocab, (n, max_new)).astype(np.int32) * c_mask
    adv = rng.standard_normal((n, 1)).astype(np.float32) * c_mask
    old = -rng.uniform(0.5, 3.0, (n, max_new)).astype(np.float32) * c_mask
    zeros = np.zeros_like(p_attn, np.float32)
    return {
        "input_ids": np.concatenate([p_ids, c_ids], 1),
        "attention_mask": np.concatenate([p_attn, c_mask], 1),
        "loss_mask": np.concatenate([np.zeros_like(p_attn), c_mask], 1),
        "old_logp": np.concatenate([zeros, old], 1),
        "advantages": np.concatenate([zeros, adv], 1),
    }, lengths


def main(argv=None) -> int:
    args = _parse(argv)
    from jaxrl_llm.train.config.config_io import load_config
    from jaxrl_llm.train.config.run_config import RunConfig
    from jaxrl_llm.train.online.learner import PackSpec
    from jaxrl_llm.train.online.trainer import OnlineTrainer

    base = common.online_run_overrides(args.model, kl_coef=0.0, prefix="bench_pack_")
    cfg = load_config(RunConfig, args.config, base + ["logprobs.shared_prompt=false"])
    trainer = OnlineTrainer(cfg, log_stream=sys.stderr)
    policy = trainer.policy
    r = cfg.rollout
    results: dict[str, dict] = {}
    rng = np.random.default_rng(0)
    trainers = [trainer]
    try:
        batches = []
        for step in range(1, args.batches + 1):
            exp, _ = trainer.experience(step)
            prepared = trainer.strategy.prepare(exp, None)
            batch = dict(prepared.batch)
            batches.append(batch)
        width = r.max_new_tokens
        padded_l = trainer.learner
        packed_l = copy.copy(padded_l)
        packed_l.pack = PackSpec(width)
        cells: dict[str, list] = {"padded": [], "packed": []}
        tokens = 0.0
        fills = []
        for i, batch in enumerate(batches):
            tokens += float(batch["attention_mask"].sum())
            for name, learner in (("padded", padded_l), ("packed", packed_l)):
                common.log(f"main job batch {i}: {name}")
                t, m = _time_update(learner, policy, batch, args.repeats)
                cells[name].append(t)
                if name == "packed":
                    fills.append(m["pack/fill"])
        slots = sum(float(b["attention_mask"].size) for b in batches)
        results["main job"] = {
            "padded_s": float(np.sum(cells["padded"])),
            "packed_s": float(np.sum(cells["packed"])),
            "tokens": tokens,
            "padded_fill": tokens / slots,
            "packed_fill": float(np.mean(fills)),
            "rows": f"{len(batches)} batches × {batches[0]['input_ids'].shape[0]} rows, "
            f"T = {batches[0]['input_ids'].shape[1]}",
        }

        # long tail: a trainer without skipping, its window the long completions
        long_cfg = load_config(
            RunConfig,
            args.config,
            base
            + [
                "logprobs.shared_prompt=false",
                "rollout.skip_zero_advantage=false",
                f"rollout.max_new_tokens={args.max_new}",
            ],
        )
        long_t = OnlineTrainer(long_cfg, policy=policy, log_stream=sys.stderr)
        trainers.append(long_t)
        src = dict(batches[0], completion_width=width)
        long_batch, lengths = _long_tail(
            src,
            rng,
            groups=args.long_prompts,
            g=r.group_size,
            max_new=args.max_new,
            median=args.median,
            vocab=policy.config.vocab_size,
        )
        padded_l = long_t.learner
        packed_l = copy.copy(padded_l)
        packed_l.pack = PackSpec(args.max_new)
        res = {}
        for name, learner in (("padded", padded_l), ("packed", packed_l)):
            common.log(f"long tail: {name}")
            res[name], m = _time_update(learner, policy, long_batch, args.repeats)
            if name == "packed":
                res["fill"] = m["pack/fill"]
        tok = float(long_batch["attention_mask"].sum())
        results["long tail"] = {
            "padded_s": res["padded"],
            "packed_s": res["packed"],
            "tokens": tok,
            "padded_fill": tok / long_batch["attention_mask"].size,
            "packed_fill": res["fill"],
            "rows": f"{len(lengths)} rows, T = {long_batch['input_ids'].shape[1]}, completions "
            f"median {int(np.median(lengths))}, mean {lengths.mean():.0f}, max {lengths.max()}",
        }
    finally:
        for t in trainers:
            t.close()

    header = [
        "workload",
        "batch",
        "padded: s / update",
        "packed: s / update",
        "padded tokens/s",
        "packed tokens/s",
        "packed / padded",
        "fill padded → packed",
    ]
    rows = []
    for name, d in results.items():
        rows.append(
            [
                name,
                d["rows"],
                f"{d['padded_s']:.2f}",
                f"{d['packed_s']:.2f}",
                f"{d['tokens'] / d['padded_s']:.0f}",
                f"{d['tokens'] / d['packed_s']:.0f}",
                f"{d['padded_s'] / d['packed_s']:.2f}×",
                f"{d['padded_fill']:.2f} → {d['packed_fill']:.2f}",
            ]
        )
    body = [
        f"Config: `{os.path.relpath(args.config, common.ROOT)}` with model.source="
        f"{'tiny' if args.model == common.TINY else args.model} (its LoRA adapters), "
        "`logprobs.shared_prompt: false` in both layouts. Seconds per `Learner.update` (host "
        f"packing + the jitted step), best of {args.repeats} after a compiling call; the main "
        "job's row sums its batches. Tokens/s counts real tokens (attention mask 1).",
        "",
        *common.markdown_table(header, rows),
    ]
    common.write_report(
        args.out,
        title="Learner update: packed vs padded rows",
        command=common.command_line(__file__, argv),
        body=body,
        metrics=results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
