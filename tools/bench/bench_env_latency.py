"""Environment latency beside generation (issue 17 §2): multi-turn episodes whose environment
sleeps ``--sleep`` seconds per step, against the same episodes with an instant environment,
in one run. If environment calls held the batch, the added wall time would be turns × sleep
× episodes (every call in series); with calls in a thread pool and the other rows decoding,
it is far less.

Full run:   python tools/bench/bench_env_latency.py --out tools/bench/results/env_latency.md
Smoke test: python tools/bench/bench_env_latency.py --model tiny --out /tmp/env_latency.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

_LETTERS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class SleepyEnv:
    """Answers every turn with "Go on." after ``sleep`` seconds; done after ``turns`` turns."""

    def __init__(self, sleep: float, turns: int):
        self.sleep, self.turns, self.t = sleep, turns, 0

    def reset(self, item):
        return [{"role": "user", "content": item["prompt"]}]

    def step(self, text):
        from jaxrl_llm.envs import Step

        time.sleep(self.sleep)
        self.t += 1
        if self.t >= self.turns:
            return Step(done=True)
        return Step(messages=[{"role": "user", "content": "Go on."}])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=common.DEFAULT_MODEL, help="alias/path or 'tiny'")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--turn-tokens", type=int, default=24)
    p.add_argument("--sleep", type=float, default=0.2)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import jax

    from jaxrl_llm.envs import ChatCodec, Episode, run_episodes
    from jaxrl_llm.sampling import SamplingConfig, stop_token_ids

    if args.model == common.TINY:  # byte tokenizer; letters end a turn, so turns are short
        from jaxrl_llm.data.tokenize import CharTokenizer
        from jaxrl_llm.models import ModelConfig, init_params

        config = ModelConfig.tiny(vocab_size=259, eos_token_ids=(2, *(3 + b for b in _LETTERS)))
        params, tok = init_params(config, jax.random.PRNGKey(0)), CharTokenizer()
    else:
        config, params, tok = common.load_model(args.model)
    sampling = SamplingConfig(temperature=1.0)
    codec = ChatCodec(tok, stop_token_ids(config, sampling))
    questions = [f"Tell me a short fact about the number {i + 3}." for i in range(args.prompts)]

    def play(sleep: float):
        eps = [
            Episode(
                item={"prompt": q},
                prompt_id=i,
                sample_id=s,
                env=SleepyEnv(sleep, args.turns),
                fallback_ids=[1],
            )
            for i, q in enumerate(questions)
            for s in range(args.group)
        ]
        t = time.perf_counter()
        stats = run_episodes(
            params,
            config,
            eps,
            codec=codec,
            sampling=sampling,
            seed=0,
            group_size=args.group,
            max_turns=args.turns,
            turn_tokens=args.turn_tokens,
            budget=args.turns * (args.turn_tokens + 24),
            workers=args.workers,
        )
        return time.perf_counter() - t, eps, stats

    play(0.0)  # compile every program
    rows, metrics = [], {}
    results = {}
    for sleep in (0.0, args.sleep, 0.0, args.sleep):  # alternated: noise shows as spread
        wall, eps, stats = play(sleep)
        calls = sum(ep.turns for ep in eps)
        results.setdefault(sleep, []).append((wall, calls, stats["idle_s"]))
        rows.append([f"{sleep:g}", f"{wall:.2f}", str(calls), f"{stats['idle_s']:.2f}"])
        common.log(rows[-1])
    w0 = min(w for w, _, _ in results[0.0])
    w1 = min(w for w, _, _ in results[args.sleep])
    calls = results[args.sleep][0][1]
    serial = calls * args.sleep
    metrics.update(
        wall_instant_s=w0,
        wall_sleepy_s=w1,
        added_s=w1 - w0,
        serial_added_s=serial,
        added_over_serial=(w1 - w0) / serial,
    )
    n = args.prompts * args.group
    body = [
        f"Model: {args.model}. {args.prompts} prompts × G={args.group} = {n} episodes, "
        f'{args.turns} turns each (the environment answers "Go on."), ≤ {args.turn_tokens} '
        f"tokens per turn, {args.workers} environment threads; each setting run twice, "
        f"alternating, after a compile run. idle s: time the host waited on the environment "
        f"with no row decoding.",
        "",
        *common.markdown_table(
            ["env sleep per step (s)", "wall s", "env calls", "idle s"], rows, align="rrrr"
        ),
        "",
        f"Added wall time with a {args.sleep:g} s environment: {w1 - w0:.2f} s (best of 2 "
        f"each) vs {serial:.1f} s if the {calls} calls ran in series "
        f"({(w1 - w0) / serial:.1%} of it).",
    ]
    return common.report(
        args.out,
        __file__,
        argv,
        title="Environment latency beside generation",
        body=body,
        metrics=metrics,
    )


if __name__ == "__main__":
    sys.exit(main())
