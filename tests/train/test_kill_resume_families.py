"""Kill and resume for the other trainer families (issue 21): PPO (policy + critic, two
checkpointers), on-policy distillation (a frozen teacher) and
an offline algorithm (SFT). Each tiny run (``jaxrl-llm train`` in a subprocess, the harness of
``test_kill_resume.py``) is SIGKILLed at fault points — during an update, while a checkpoint is
being written, at a random moment — resumed until it completes, and must end exactly where an
uninterrupted run ends: the same parameters bit for bit (PPO: the critic's too) and the same
``metrics.jsonl`` rows apart from wall-clock timings.
"""

from __future__ import annotations

import json
import os
import random

import jax
import numpy as np
import pytest
import yaml

from jaxrl_llm.train.run.checkpoint import restore_model
from jaxrl_llm.train.run.logging import read_metrics
from tests.train.test_kill_resume import (
    ROOT,
    TIMING_KEYS,
    _env,
    _finalised_steps,
    _run_and_kill,
    _run_to_end,
)

MAX_STEPS = 6


def _deterministic(rows):
    """Metrics rows without wall-clock fields (the offline loop also logs ``tokens_per_s``)."""
    timing = (*TIMING_KEYS, "tokens_per_s")
    return [{k: v for k, v in r.items() if not k.startswith(timing)} for r in rows]


TINY = dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1))


def _prompts(d) -> tuple[str, str]:
    rng = random.Random(0)
    rows = []
    for _ in range(40):
        a, b = rng.sample(range(10), 2)
        rows.append({"prompt": f"{a}{b}>", "answer": str(max(a, b))})
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:32]))
    (d / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[32:]))
    return str(d / "train.jsonl"), str(d / "eval.jsonl")


def _config(d, algorithm: str) -> str:
    common = dict(
        seed=0,
        max_steps=MAX_STEPS,
        algorithm=algorithm,
        model=TINY,
        checkpoint=dict(save_every=2, keep=2, export_hf=False),
        logging=dict(tensorboard=False, plots=False),
    )
    if algorithm == "sft":
        cfg = dict(
            common,
            optim=dict(lr=1e-3),
            data=dict(
                train=os.path.join(ROOT, "data", "arith_sft", "train.jsonl"),
                eval=None,
                max_length=48,
                length_policy="truncate",
            ),
            train=dict(batch_size=4),
        )
    else:
        train, held_out = _prompts(d)
        cfg = dict(
            common,
            optim=dict(lr=1e-2),
            data=dict(train=train, eval=held_out, max_length=32),
            # two minibatches: an "update" kill lands between two optimizer updates of a step
            rollout=dict(prompts_per_step=4, group_size=2, max_new_tokens=3, minibatches=2),
            rewards=[dict(name="tests.train.toy_rewards:larger_digit")],
            eval=dict(before=False, every=0, num_examples=4, batch_size=4),
        )
        if algorithm == "distill":  # a frozen teacher, loaded again by every resumed process
            cfg["teacher"] = dict(source="tiny", tokenizer="char", tiny=dict(num_layers=2))
    path = d / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


# the families with state of their own to restore (PPO's critic, the offline loop, a
# distillation teacher); GRPO's is tests/train/test_kill_resume.py. Online DPO keeps no state
# GRPO does not (its case took 51 s of the suite on a 2-core host).
SCHEDULES = {
    "ppo": [("update", 3), ("checkpoint", 4)],
    "sft": [("checkpoint", 2), ("random", 3)],  # the offline loop has no update fault point
    "distill": [("update", 3), ("checkpoint", 4)],
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(SCHEDULES))
def test_killed_and_resumed_run_equals_uninterrupted_run(algorithm, tmp_path, jax_cache_dir):
    config = _config(tmp_path, algorithm)
    cache = jax_cache_dir
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    _run_to_end(config, straight, _env(cache))
    for phase, step in SCHEDULES[algorithm]:
        before = _finalised_steps(killed)
        if phase == "random":
            err = _run_and_kill(config, killed, _env(cache), after_step=step, delay=0.05)
        else:
            err = _run_and_kill(
                config, killed, _env(cache, f"{phase}:{step}"), after_step=None, delay=0.0
            )
        resumed = [ln for ln in err.splitlines() if ln.startswith("resumed from step")]
        assert resumed == ([f"resumed from step {before[-1]}"] if before else []), (phase, err)
    _run_to_end(config, killed, _env(cache), resume=True)

    subdirs = ["checkpoints"] + (["critic_checkpoints"] if algorithm == "ppo" else [])
    for sub in subdirs:
        _, pa, _ = restore_model(os.path.join(straight, sub), step=MAX_STEPS)
        _, pb, _ = restore_model(os.path.join(killed, sub), step=MAX_STEPS)
        jax.tree.map(
            lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), pa, pb
        )
    a, b = read_metrics(straight), read_metrics(killed)
    assert [r["step"] for r in b if r.get("loss") is not None] == list(range(1, MAX_STEPS + 1))
    assert _deterministic(b) == _deterministic(a)


@pytest.mark.slow
def test_killed_and_resumed_asynchronous_run_keeps_its_data_and_staleness_bound(
    tmp_path, jax_cache_dir
):
    """GRPO with ``rollout.max_staleness: 1`` (rollouts sampled one step ahead in a thread),
    killed during an update and at a random moment, resumed to the end. What "exact" means
    here (train/online/producer.py): the checkpoint holds the data position after the last batch the
    learner took, so a resumed run samples the in-flight batch again — every step trains on the
    prompts an uninterrupted run draws for it, each step once, and no batch is more than one
    step stale. The weights a resumed batch was sampled with may be fresher than in the
    uninterrupted run (the in-flight batch is re-sampled), so parameters are not compared."""
    config = _config(tmp_path, "grpo")
    cfg = yaml.safe_load(open(config))
    cfg["rollout"]["max_staleness"] = 1
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    cache = jax_cache_dir
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    _run_to_end(config, straight, _env(cache))
    for phase, step in [("update", 3), ("random", 4)]:
        if phase == "random":
            _run_and_kill(config, killed, _env(cache), after_step=step, delay=0.05)
        else:
            _run_and_kill(
                config, killed, _env(cache, f"{phase}:{step}"), after_step=None, delay=0.0
            )
    _run_to_end(config, killed, _env(cache), resume=True)
    a = [r for r in read_metrics(straight) if r.get("loss") is not None]
    b = [r for r in read_metrics(killed) if r.get("loss") is not None]
    assert [r["step"] for r in b] == list(range(1, MAX_STEPS + 1))
    assert [r["data/prompts_crc32"] for r in b] == [r["data/prompts_crc32"] for r in a]
    assert all(r["async/staleness_max"] <= 1 for r in b), [r["async/staleness_max"] for r in b]
