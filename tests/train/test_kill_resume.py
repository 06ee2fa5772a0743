"""Kill and resume: a tiny GRPO run (``jaxrl-llm train`` in a subprocess) is SIGKILLed again
and again — during a rollout, during an update, while a checkpoint is being written, and at
random moments — and resumed with ``--resume`` until it completes. It must end exactly where an
uninterrupted run with the same seed ends: the same parameters (bit for bit), the same
``metrics.jsonl`` (every row once, in order, equal values except wall-clock timings) and the
same prompts at every step (no example skipped or seen twice).

Bit-exact equality holds on CPU because every random choice of the loop is a function of
(seed, step) or lives in the checkpoint (train-state rng, data position), the restored arrays
are the saved float32 bytes, and XLA:CPU runs the same compiled program in every process (the
processes share a persistent compilation cache, so they start in seconds; a cached executable
is the one a fresh compile would produce). They compile with LLVM's optimisations off
(``FAST_COMPILE_XLA_FLAGS``): every process of a comparison runs with the same flags.

The phase kills use the ``JAXRL_LLM_FAULT=PHASE:STEP`` hook of ``jaxrl_llm.train.run.faults``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib

import jax
import numpy as np
import pytest
import yaml

from jaxrl_llm.data import CharTokenizer, Format, make_iterator, prepare_dataset
from jaxrl_llm.train.run.checkpoint import restore_model
from jaxrl_llm.train.run.logging import read_metrics
from tests.conftest import FAST_COMPILE_XLA_FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_STEPS = 12
SAVE_EVERY = 2
PROMPTS_PER_STEP = 4
NUM_PROMPTS = 40  # 10 steps per epoch: the run crosses an epoch boundary
# Wall-clock fields differ between any two runs; everything else must be equal.
TIMING_KEYS = ("time/", "rollout/tokens_per_s")
TMP_MARK = ".orbax-checkpoint-tmp"


def _write_run_files(d) -> str:
    rng = random.Random(0)
    rows = []
    for _ in range(NUM_PROMPTS + 8):
        a, b = rng.sample(range(10), 2)
        rows.append({"prompt": f"{a}{b}>", "answer": str(max(a, b))})
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:NUM_PROMPTS]))
    (d / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[NUM_PROMPTS:]))
    cfg = dict(
        seed=0,
        max_steps=MAX_STEPS,
        algorithm="grpo",
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        optim=dict(lr=1e-2),
        data=dict(train=str(d / "train.jsonl"), eval=str(d / "eval.jsonl"), max_length=32),
        # two minibatches, so an "update" kill lands between two optimizer updates of a step
        rollout=dict(
            prompts_per_step=PROMPTS_PER_STEP, group_size=4, max_new_tokens=3, minibatches=2
        ),
        loss=dict(kl_coef=0.04),
        rewards=[dict(name="tests.train.toy_rewards:larger_digit")],
        eval=dict(before=True, every=5, num_examples=8, batch_size=8),
        checkpoint=dict(save_every=SAVE_EVERY, keep=2),
        logging=dict(tensorboard=False, plots=False),
    )
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _env(cache_dir: str, fault: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("JAXRL_LLM_FAULT", None)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count=2 {FAST_COMPILE_XLA_FLAGS}",
        JAX_COMPILATION_CACHE_DIR=cache_dir,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    )
    if fault:
        env["JAXRL_LLM_FAULT"] = fault
    return env


def _command(config: str, out: str, resume: bool) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from jaxrl_llm.cli.main import main; sys.exit(main())",
        "train",
        config,
        f"output_dir={out}",
    ] + (["--resume"] if resume else [])


def _run_to_end(config, out, env, resume=False) -> str:
    p = subprocess.run(
        _command(config, out, resume),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stderr


def _run_and_kill(config, out, env, *, after_step: int | None, delay: float) -> str:
    """Start (resuming), and SIGKILL it ``delay`` s after its progress line for ``after_step``
    (None: leave it to its ``JAXRL_LLM_FAULT`` hook). Returns its stderr."""
    p = subprocess.Popen(
        _command(config, out, True),
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    lines = []
    try:
        for line in p.stderr:
            lines.append(line)
            if after_step is not None and line.startswith(f"step {after_step}/"):
                time.sleep(delay)
                p.send_signal(signal.SIGKILL)
                break
        lines.append(p.stderr.read())
        p.wait(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = "".join(lines)
    assert p.returncode == -signal.SIGKILL, f"rc={p.returncode}: {err[-3000:]}"
    return err


def _finalised_steps(out) -> list[int]:
    """Finalised checkpoint steps, read without opening a manager (which would clean up)."""
    d = os.path.join(out, "checkpoints")
    return sorted(int(e) for e in os.listdir(d) if e.isdigit()) if os.path.isdir(d) else []


def _deterministic(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in rows]


def _expected_prompt_crcs(train_path) -> list[int]:
    """The fingerprint of the prompts each step of an uninterrupted run draws (the trainer's
    ``data/prompts_crc32``), straight from a fresh data iterator."""
    data = prepare_dataset(
        str(train_path), Format.PROMPT, CharTokenizer(), max_len=32, length_policy="truncate"
    )
    it = make_iterator(data.items, batch_size=PROMPTS_PER_STEP, seed=0)
    crcs = []
    for _ in range(MAX_STEPS):
        crc = 0
        for x in next(it):
            crc = zlib.crc32(np.asarray(x.prompt_ids, np.int32).tobytes(), crc)
        crcs.append(crc)
    return crcs


@pytest.mark.slow
def test_killed_and_resumed_run_equals_uninterrupted_run(tmp_path, jax_cache_dir):
    config = _write_run_files(tmp_path)
    cache = jax_cache_dir
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    _run_to_end(config, straight, _env(cache))

    # Seeded schedule: phase kills at random steps (a rollout before the first checkpoint, an
    # update between two checkpoints, a checkpoint write), kills at random moments (a random
    # delay after a random step's progress line: in a rollout, an update, a checkpoint write or
    # an evaluation), a kill during the final checkpoint write, then resume to the end. Each
    # target step lies past the checkpoint the previous kill falls back to, so every run
    # reaches its kill.
    rng = random.Random(20240611)
    s_ckpt = rng.choice([6, 8])
    s_random = rng.randint(s_ckpt - 1, s_ckpt + 1)
    schedule = [
        ("rollout", rng.randint(1, 3)),
        ("update", rng.randint(3, 5)),
        ("checkpoint", s_ckpt),
        ("random", s_random),
        ("random", rng.randint(s_random + 1, MAX_STEPS - 1)),
        ("checkpoint", MAX_STEPS),
    ]
    log = []
    for phase, step in schedule:
        before = _finalised_steps(killed)
        if phase == "random":
            delay = rng.uniform(0.0, 0.25)
            err = _run_and_kill(config, killed, _env(cache), after_step=step, delay=delay)
        else:
            err = _run_and_kill(
                config, killed, _env(cache, f"{phase}:{step}"), after_step=None, delay=0.0
            )
        resumed = [l for l in err.splitlines() if l.startswith("resumed from step")]
        assert resumed == ([f"resumed from step {before[-1]}"] if before else []), (phase, err)
        ckpt_dir = os.path.join(killed, "checkpoints")
        leftovers = [e for e in os.listdir(ckpt_dir) if TMP_MARK in e]
        steps = _finalised_steps(killed)
        if phase == "checkpoint":  # the kill cut this step's checkpoint write short
            assert step not in steps, (steps, leftovers)
        if steps:  # the latest finalised checkpoint (the one a resume reads) is complete
            _, params, _ = restore_model(ckpt_dir, step=steps[-1])
            assert jax.tree.leaves(params)
        log.append((phase, step, steps, leftovers))
    assert len(log) == len(schedule)
    # Some kills left a partly written checkpoint (orbax's temporary directory) behind, which
    # the next run did not read (its "resumed from" step was the latest finalised one).
    assert any(leftovers for *_, leftovers in log), log
    _run_to_end(config, killed, _env(cache), resume=True)
    # A finished run resumed once more changes nothing (its last checkpoint is the final step).
    err = _run_to_end(config, killed, _env(cache), resume=True)
    assert f"resumed from step {MAX_STEPS}" in err

    # Parameters: bit for bit.
    _, pa, _ = restore_model(os.path.join(straight, "checkpoints"), step=MAX_STEPS)
    _, pb, _ = restore_model(os.path.join(killed, "checkpoints"), step=MAX_STEPS)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), pa, pb)

    # Metrics: the same rows in the same order (eval before, steps 1..N once each, eval after)
    # with equal values; only the wall-clock timings may differ.
    a, b = read_metrics(straight), read_metrics(killed)
    train_steps = [r["step"] for r in b if r.get("loss") is not None]
    assert train_steps == list(range(1, MAX_STEPS + 1)), (train_steps, log)
    assert [r["step"] for r in b] == [r["step"] for r in a], log
    assert _deterministic(b) == _deterministic(a), log

    # Data: each step drew the prompts a fresh iterator yields for it (no example skipped or
    # repeated across the restarts); the run crossed an epoch boundary.
    crcs = [r["data/prompts_crc32"] for r in b if r.get("loss") is not None]
    assert crcs == _expected_prompt_crcs(tmp_path / "train.jsonl")
    assert [r["data/epoch"] for r in b if r.get("loss") is not None][-1] > 1.0
