"""Kill and resume of a multi-turn run (issue 17): GRPO in a scripted environment (the tiny
model ends its turns on letters and digits, so episodes take several turns), SIGKILLed during
an update and at a random moment, resumed to the end: the same parameters bit for bit and the
same metrics rows (apart from wall-clock timings) as an uninterrupted run. The harness is
tests/train/test_kill_resume.py's (``jaxrl-llm train`` in a subprocess)."""

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
from tests.envs.scripted import STOP
from tests.train.test_kill_resume import (
    TIMING_KEYS,
    _env,
    _finalised_steps,
    _run_and_kill,
    _run_to_end,
)

MAX_STEPS = 4


def _config(d) -> str:
    rng = random.Random(0)
    rows = []
    for _ in range(24):
        a, b = rng.sample(range(10), 2)
        rows.append({"prompt": [{"role": "user", "content": f"{a}{b}>"}], "answer": str(max(a, b))})
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:20]))
    (d / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[20:]))
    cfg = dict(
        seed=0,
        max_steps=MAX_STEPS,
        algorithm="grpo",
        model=dict(
            source="tiny", tokenizer="char", tiny=dict(num_layers=1, eos_token_ids=[2, *STOP])
        ),
        optim=dict(lr=1e-2),
        data=dict(train=str(d / "train.jsonl"), eval=str(d / "eval.jsonl"), max_length=32),
        rollout=dict(prompts_per_step=4, group_size=2, max_new_tokens=40, minibatches=2),
        env=dict(name="tests.envs.scripted:Scripted", kwargs=dict(replies=["ok"]), max_turns=3),
        rewards=[dict(name="tests.train.toy_rewards:larger_digit")],
        eval=dict(before=False, every=0, num_examples=4, batch_size=4),
        checkpoint=dict(save_every=1, keep=2, export_hf=False),
        logging=dict(tensorboard=False, plots=False, samples_every=1),
    )
    path = d / "env.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _deterministic(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in rows]


@pytest.mark.slow
def test_killed_and_resumed_multi_turn_run_equals_uninterrupted_run(tmp_path):
    config = _config(tmp_path)
    cache = str(tmp_path / "jax_cache")
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    _run_to_end(config, straight, _env(cache))
    for phase, step in [("update", 2), ("random", 3)]:
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
    _, pa, _ = restore_model(os.path.join(straight, "checkpoints"), step=MAX_STEPS)
    _, pb, _ = restore_model(os.path.join(killed, "checkpoints"), step=MAX_STEPS)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), pa, pb)
    a, b = read_metrics(straight), read_metrics(killed)
    assert [r["step"] for r in b if "loss" in r] == list(range(1, MAX_STEPS + 1))
    assert all(r["env/turns_mean"] > 1 for r in b if "loss" in r)
    assert _deterministic(b) == _deterministic(a)
    # samples.jsonl holds each step's episodes once, as the uninterrupted run wrote them
    sa = open(os.path.join(straight, "samples.jsonl")).read().splitlines()
    sb = open(os.path.join(killed, "samples.jsonl")).read().splitlines()
    assert sb == sa and len(sa) == MAX_STEPS * 8
