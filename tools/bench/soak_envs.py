"""Soak: a long multi-turn ``tools`` run on the tiny model whose environment misbehaves
(issue 31). Of the environment's ``step`` calls, ``--hostile`` (default 10%) sleep past
``env.step_timeout_s``, raise, return a NaN reward or return a 1 MB observation, in equal
shares (a seeded draw per call). The run must keep a steady step time, not grow its threads,
child processes or memory, and lose no row of ``metrics.jsonl`` / ``samples.jsonl``.

Reported: the median step time of the first and the last quarter of the steps (step 1, which
compiles, left out), and at every ``--every`` steps the process's threads (``/proc`` and
Python's), child processes, RSS and the user-code threads stuck in a sleep; then the row
counts. Exit status 1 when a check fails (rows lost; threads, children or RSS at the end above
the first half's peak by more than ``--tolerance``; the last quarter slower by more than it).

Run in-process (``train_online``) so that the monitor sees the trainer's own threads.

Full run (a quiet machine):  python tools/bench/soak_envs.py --steps 200
Smoke test:                  python tools/bench/soak_envs.py --steps 20 --every 5
Per-call cost of user code:  python tools/bench/soak_envs.py --overhead 2000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a CPU soak: no libtpu discovery noise

from jaxrl_llm.envs import Step, ToolEnv  # noqa: E402

# Char-tokenizer ids of letters and digits: as stop tokens they end the random tiny model's
# turns after a few tokens, so episodes take several turns (tests/envs/scripted.py).
STOP = [3 + b for b in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
MODES = ("sleep", "raise", "nan", "big")


class HostileToolEnv(ToolEnv):
    """The ``tools`` environment, except that a share ``hostile`` of its ``step`` calls
    misbehaves: sleeps ``sleep_s`` (past the run's timeout), raises, returns a NaN reward or a
    1 MB tool message (a seeded draw per call; ``counts`` tallies them per process)."""

    counts: dict[str, int] = dict.fromkeys(MODES, 0)
    lock = threading.Lock()

    def __init__(self, hostile: float = 0.1, sleep_s: float = 2.0, seed: int = 0, **kw):
        super().__init__(**kw)
        self.hostile, self.sleep_s = float(hostile), float(sleep_s)
        self.rng = random.Random(seed)

    episodes = 0

    def reset(self, item: dict) -> list[dict]:
        """The tools prompt; the draws are seeded by the row and the episode's number (seeded
        by the row alone, each of the 64 prompts repeated one sequence of draws, and no prompt's
        sequence held a ``sleep``)."""
        with HostileToolEnv.lock:
            HostileToolEnv.episodes += 1
            n = HostileToolEnv.episodes
        self.rng.seed(f"{json.dumps(item, sort_keys=True, default=str)}/{n}")
        return super().reset(item)

    def step(self, text: str) -> Step:
        """Misbehave with probability ``hostile``, else answer as the tools environment."""
        if self.rng.random() >= self.hostile:
            return super().step(text)
        mode = MODES[self.rng.randrange(len(MODES))]
        with HostileToolEnv.lock:
            HostileToolEnv.counts[mode] += 1
        if mode == "sleep":
            time.sleep(self.sleep_s)
            return Step(done=True)
        if mode == "raise":
            raise RuntimeError("hostile environment")
        if mode == "nan":
            return Step(messages=[{"role": "tool", "content": "nan"}], reward=math.nan)
        return Step(messages=[{"role": "tool", "content": "x" * 1_000_000}])


def _proc() -> dict[str, float]:
    """This process's OS threads, child processes and RSS (MiB), from /proc."""
    out = {"threads": 0.0, "children": 0.0, "rss_mib": 0.0}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Threads:"):
                out["threads"] = float(line.split()[1])
            elif line.startswith("VmRSS:"):
                out["rss_mib"] = int(line.split()[1]) / 1024
    kids = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children", encoding="ascii") as f:
                kids += len(f.read().split())
        except OSError:
            pass
    out["children"] = float(kids)
    return out


def _data(path: str, n: int) -> None:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            f.write(json.dumps({"prompt": f"{a}*{b}=", "answer": str(a * b)}) + "\n")


def _config(args, d: str):
    from jaxrl_llm.train.config.config_io import from_dict
    from jaxrl_llm.train.config.run_config import RunConfig

    _data(os.path.join(d, "train.jsonl"), 64)
    return from_dict(
        RunConfig,
        dict(
            output_dir=os.path.join(d, "run"),
            max_steps=args.steps,
            algorithm="grpo",
            seed=0,
            model=dict(
                source="tiny",
                tokenizer="char",
                # a context that holds the tools system prompt (280 characters) and the budget
                tiny=dict(num_layers=1, eos_token_ids=[2, *STOP], max_position_embeddings=1024),
            ),
            optim=dict(lr=1e-3),
            # openings (the tools system prompt, ~280 characters) fit data.max_length
            data=dict(train=os.path.join(d, "train.jsonl"), max_length=384),
            rollout=dict(prompts_per_step=4, group_size=2, max_new_tokens=48),
            env=dict(
                name="soak_envs:HostileToolEnv",
                kwargs=dict(hostile=args.hostile, sleep_s=2 * args.timeout),
                max_turns=4,
                step_timeout_s=args.timeout,
                max_failures=10**6,
            ),
            eval=dict(before=False, every=0),
            checkpoint=dict(save_every=max(args.steps // 4, 1), keep=2, export_hf=False),
            logging=dict(tensorboard=False, plots=False, samples_every=1),
        ),
    )


class Monitor(threading.Thread):
    """Samples :func:`_proc` whenever ``metrics.jsonl`` gains ``every`` more rows."""

    def __init__(self, path: str, every: int):
        super().__init__(daemon=True)
        self.path, self.every, self.samples, self.stop = path, every, [], threading.Event()

    def run(self) -> None:
        """Poll every 0.2 s."""
        seen = 0
        while not self.stop.is_set():
            rows = _rows(self.path)
            if rows >= seen + self.every:
                seen = rows - rows % self.every
                self.samples.append(
                    {
                        "step": rows,
                        **_proc(),
                        "py_threads": threading.active_count(),
                        "stuck": self.stuck(),
                    }
                )
            time.sleep(0.2)

    @staticmethod
    def stuck() -> int:
        """User-code threads still inside a call past its deadline."""
        from jaxrl_llm.rewards.user_code import shared_runner

        return shared_runner("env").stuck


def _rows(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def _echo(x):
    return x


def overhead(n: int) -> None:
    """Print the cost of one user call: direct, on :class:`UserCodeRunner` (with a deadline),
    and a round trip to a persistent worker process (``ProcessPoolExecutor``, forkserver), the
    alternative design; the median of 5 rounds of ``n`` calls each."""
    import concurrent.futures as cf
    import multiprocessing as mp

    from jaxrl_llm.rewards.user_code import UserCodeRunner

    runner = UserCodeRunner(1, "overhead")
    procs = cf.ProcessPoolExecutor(1, mp_context=mp.get_context("forkserver"))
    procs.submit(_echo, 0).result()  # the worker started
    ways = {
        "direct": lambda: _echo(1),
        "thread (UserCodeRunner, timeout_s=5)": lambda: runner.call(_echo, 1, timeout_s=5.0),
        "process (ProcessPoolExecutor, forkserver)": lambda: procs.submit(_echo, 1).result(),
    }
    for name, fn in ways.items():
        rounds = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                fn()
            rounds.append((time.perf_counter() - t) / n)
        print(f"{name}: {statistics.median(rounds) * 1e6:.1f} us per call")
    procs.shutdown()


def main() -> int:
    """Run the soak and print its report; exit 1 when a check fails."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--overhead",
        type=int,
        default=0,
        metavar="N",
        help="only measure the per-call cost of user code (N calls a round) and exit",
    )
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=20, help="sample the process every N steps")
    p.add_argument("--hostile", type=float, default=0.1, help="share of misbehaving calls")
    p.add_argument("--timeout", type=float, default=1.0, help="env.step_timeout_s")
    p.add_argument("--tolerance", type=float, default=0.05, help="allowed growth (0.05 = 5%%)")
    p.add_argument("--dir", default=None, help="run directory (default: a temporary one)")
    args = p.parse_args()
    if args.overhead:
        overhead(args.overhead)
        return 0
    d = args.dir or tempfile.mkdtemp(prefix="soak_envs_")
    os.makedirs(d, exist_ok=True)
    cfg = _config(args, d)
    from jaxrl_llm.train.online.trainer import train_online

    mon = Monitor(os.path.join(cfg.output_dir, "metrics.jsonl"), args.every)
    mon.start()
    t0 = time.perf_counter()
    with open(os.devnull, "w") as quiet:
        train_online(cfg, log_stream=quiet)
    wall = time.perf_counter() - t0
    mon.stop.set()
    mon.join()
    time.sleep(2.0)  # the last checkpoint's writer threads wind down
    mon.samples.append(
        {"step": "end", **_proc(), "py_threads": threading.active_count(), "stuck": mon.stuck()}
    )
    return _report(args, cfg, mon.samples, wall)


def _report(args, cfg, samples: list[dict], wall: float) -> int:
    import soak_envs  # the copy the run imported by name (this file runs as __main__)

    counts = soak_envs.HostileToolEnv.counts
    rows = [json.loads(x) for x in open(os.path.join(cfg.output_dir, "metrics.jsonl"))]
    steps = [r["step"] for r in rows if r.get("loss") is not None]
    with open(os.path.join(cfg.output_dir, "samples.jsonl"), encoding="utf-8") as f:
        samples_rows = [json.loads(x) for x in f]
    per_step = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    times = [r["time/step_s"] for r in rows if r.get("loss") is not None][1:]  # step 1 compiles
    q = max(len(times) // 4, 1)
    first, last = statistics.median(times[:q]), statistics.median(times[-q:])
    print(f"soak: {args.steps} steps in {wall:.0f} s; hostile calls: {counts}")
    print(f"step time (median): first quarter {first:.3f} s, last quarter {last:.3f} s")
    print("step  threads  py_threads  children  rss_mib  stuck")
    for s in samples:
        print(
            f"{str(s['step']):>4}  {s['threads']:>7.0f}  {s['py_threads']:>10}  {s['children']:>8.0f}"
            f"  {s['rss_mib']:>7.1f}  {s['stuck']:>5}"
        )
    failed = sum(r.get("env/failed") or 0 for r in rows)
    timeouts = sum(r.get("env/timeouts") or 0 for r in rows)
    print(f"episodes failed: {failed}, of which timed out: {timeouts}")
    problems = []
    if steps != list(range(1, args.steps + 1)):
        problems.append(f"metrics.jsonl: steps {steps[:5]}... ({len(steps)} rows)")
    if len(samples_rows) != args.steps * per_step:
        problems.append(f"samples.jsonl: {len(samples_rows)} rows, want {args.steps * per_step}")
    # the peak of the first half (transient XLA / orbax threads) vs the end (after the run,
    # once the last checkpoint's writers are done)
    if len(samples) >= 4:
        base = samples[: len(samples) // 2]
        for key in ("threads", "children", "rss_mib"):
            ref = max(s[key] for s in base)
            top = samples[-1][key]
            if top > ref * (1 + args.tolerance) + (1 if key != "rss_mib" else 0):
                problems.append(f"{key} grew from {ref:g} to {top:g}")
    if last > first * (1 + args.tolerance) + 0.05:
        problems.append(f"the last quarter's steps are slower ({last:.3f} vs {first:.3f} s)")
    for msg in problems:
        print(f"FAIL: {msg}")
    print("ok" if not problems else f"{len(problems)} check(s) failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
