"""Steady state of the online loop: over a 200-step tiny GRPO run whose prompts and
completions vary in length, nothing is compiled after warm-up and host memory stays flat.

The run is a whole ``OnlineTrainer.run()`` (rollouts, rewards, updates, logging, periodic
evaluation and checkpoints) in a subprocess on one CPU device, so its resident memory is its
own (not pytest's) and the 8 forced test devices of ``tests/conftest.py`` do not apply.
Compilations are counted with ``jax.monitoring``: JAX records the
``/jax/core/compile/backend_compile_duration`` event once per XLA compilation (a program it
has no executable for); resident memory is ``VmRSS`` of ``/proc/self/status``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import yaml

from tests.conftest import FAST_COMPILE_XLA_FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 200
WARMUP = 60  # covers every prompt-length bucket and the first evaluation (step 50)
MAX_NEW_TOKENS = 8
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"


def _write_run_files(d) -> str:
    """Prompts of 1 to 28 digits (prompt buckets 16, 24 and 32 tokens); the reward is the toy
    task plus a length penalty, so completions end at different lengths (EOS)."""
    rng = random.Random(0)
    rows = []
    for _ in range(128):
        n = rng.randint(1, 8) if rng.random() < 0.7 else rng.randint(9, 28)
        digits = "".join(str(rng.randrange(10)) for _ in range(n))
        rows.append({"prompt": f"{digits}>", "answer": max(digits)})
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:120]))
    (d / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[120:]))
    cfg = dict(
        seed=0,
        max_steps=STEPS,
        algorithm="grpo",
        output_dir=str(d / "run"),
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        optim=dict(lr=1e-2),
        data=dict(train=str(d / "train.jsonl"), eval=str(d / "eval.jsonl"), max_length=32),
        rollout=dict(prompts_per_step=2, group_size=4, max_new_tokens=MAX_NEW_TOKENS),
        loss=dict(kl_coef=0.04),
        rewards=[
            dict(name="tests.train.toy_rewards:larger_digit"),
            dict(name="length_penalty", kwargs=dict(target=1, coef=0.1)),
        ],
        eval=dict(before=False, every=50, num_examples=8, batch_size=8),
        checkpoint=dict(save_every=50, keep=1),
        logging=dict(tensorboard=False, plots=False),
    )
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(config_path: str, out_path: str) -> None:
    """Run the config with compilation / tracing counters and an RSS probe at the start of
    every step; write them (per step and at the end) as JSON to ``out_path``. Garbage is
    collected before the two RSS readings the test compares (the end of warm-up, the end)."""
    import gc

    import jax

    from jaxrl_llm.train.config.config_io import load_config
    from jaxrl_llm.train.config.run_config import RunConfig
    from jaxrl_llm.train.online.trainer import OnlineTrainer

    counts = {COMPILE_EVENT: 0, TRACE_EVENT: 0}

    def on_event(event, duration, **_):
        if event in counts:
            counts[event] += 1

    jax.monitoring.register_event_duration_secs_listener(on_event)
    trainer = OnlineTrainer(
        load_config(RunConfig, config_path, []), log_stream=open(os.devnull, "w")
    )
    marks = {"compiles": [], "traces": [], "rss_kib": []}
    train_step = trainer.train_step

    def probed_step(step):
        if step == WARMUP + 1:  # the RSS the end is compared with (rss_kib[WARMUP]); a full
            gc.collect()  # collection takes ~0.5 s here, so not at every step
        marks["compiles"].append(counts[COMPILE_EVENT])
        marks["traces"].append(counts[TRACE_EVENT])
        marks["rss_kib"].append(_rss_kib())
        return train_step(step)

    trainer.train_step = probed_step
    try:
        trainer.run()
    finally:
        trainer.close()
    gc.collect()
    marks.update(
        final_compiles=counts[COMPILE_EVENT],
        final_traces=counts[TRACE_EVENT],
        final_rss_kib=_rss_kib(),
    )
    with open(out_path, "w") as f:
        json.dump(marks, f)


@pytest.mark.slow
def test_no_compilation_and_flat_memory_after_warmup(tmp_path):
    config = _write_run_files(tmp_path)
    out = tmp_path / "marks.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=FAST_COMPILE_XLA_FLAGS)
    code = (
        "import sys; from tests.train.test_steady_state import measure; "
        "measure(sys.argv[1], sys.argv[2])"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, config, str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    marks = json.loads(out.read_text())
    compiles, rss = marks["compiles"], marks["rss_kib"]
    assert len(compiles) == STEPS

    # The run really varies its shapes: several prompt buckets, completions ending early.
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    steps = [r for r in rows if r.get("loss") is not None]
    assert len(steps) == STEPS
    lengths = {r["completion/length_mean"] for r in steps}
    assert len(lengths) > 10 and min(lengths) < MAX_NEW_TOKENS, sorted(lengths)

    # Compilations (and traces): the warm-up compiles the loop's programs, one set per prompt
    # bucket (so the counter works); the 140 steps after it, with their evaluations and
    # checkpoints, compile and trace nothing.
    assert compiles[WARMUP] > compiles[0]
    for name in ("compiles", "traces"):
        per_step = marks[name]
        new = marks[f"final_{name}"] - per_step[WARMUP]
        late = [i for i in range(WARMUP + 1, STEPS) if per_step[i] > per_step[i - 1]]
        assert new == 0, f"{new} {name} after warm-up, at steps {late}"

    # Host memory: less than 5% growth from the end of warm-up to the end of the run.
    growth = marks["final_rss_kib"] / rss[WARMUP] - 1
    assert growth < 0.05, f"RSS grew {growth:.1%}: {rss[WARMUP]} -> {marks['final_rss_kib']} KiB"
