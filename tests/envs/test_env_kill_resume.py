"""Kill and resume of a multi-turn run (issues 17 and 31): GRPO in a scripted environment (the
tiny model ends its turns on letters and digits, so episodes take several turns) whose episodes
and reward misbehave, SIGKILLed during an update, stopped by Ctrl-C and resumed to the end: the
same parameters bit for bit and the same metrics rows (apart from wall-clock timings) as an
uninterrupted run. Kills at random moments are tests/train/test_kill_resume.py's, whose harness
this is (``jaxrl-llm train`` in a subprocess); a well-behaved multi-turn run killed and resumed
was a test of its own here until session 22 (the misbehaving run covers its path: 100-150 s of
the suite on a 2-core host)."""

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
from tests.envs.scripted import STOP, write_chat_rows
from tests.train.test_kill_resume import (
    TIMING_KEYS,
    _env,
    _run_and_kill,
    _run_to_end,
)

MAX_STEPS = 4


def _config(d) -> str:
    write_chat_rows(d, 20, 4)
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


# ----- issue 31: an environment and a reward that misbehave ------------------------------------

ENV_MODES = [
    "ok",
    "exit",
    "ok",
    "hang",
    "ok",
    "raise",
    "ok",
    "interrupt",
    "ok",
    "huge",
    "text_info",
]
REWARD_MODES = ["ok"] * 5 + ["exit"] + ["ok"] * 5 + ["hang"] + ["ok"] * 3 + ["raise"] + ["ok"] * 4


def _misbehaving_config(d) -> str:
    """The multi-turn run above, with episodes that exit, hang past ``env.step_timeout_s``,
    raise (a RuntimeError and a KeyboardInterrupt), overflow their reward and log a string, and
    a reward function that exits, hangs past its ``timeout_s`` and raises on some rows."""
    rng = random.Random(1)
    rows = []
    for i in range(20):
        a, b = rng.sample(range(10), 2)
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"{a}{b}>"}],
                "answer": str(max(a, b)),
                "mode": ENV_MODES[i % len(ENV_MODES)],
                "reward_mode": REWARD_MODES[i],
            }
        )
    (d / "bad.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = yaml.safe_load(open(_config(d)))
    cfg["data"] = dict(train=str(d / "bad.jsonl"), max_length=32)
    cfg["eval"] = dict(before=False, every=0)
    cfg["checkpoint"]["save_every"] = 2
    cfg["env"] = dict(
        name="tests.envs.scripted:Misbehaves",
        kwargs=dict(replies=["ok"], hang_s=20.0),
        max_turns=3,
        step_timeout_s=2.0,
    )
    cfg["rewards"] = [
        dict(name="tests.envs.scripted:misbehaving_reward", kwargs=dict(hang_s=20.0), timeout_s=2.0)
    ]
    path = d / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _stop_with_sigint(config, out, env) -> str:
    """Resume with ``env`` (its ``JAXRL_LLM_FAULT=PHASE:STEP:INT`` makes the run send itself
    SIGINT there: a test reading progress lines lags behind steps of milliseconds, and a
    signal sent after the last step stops nothing); returns stderr (the run must stop with
    exit 130 after saving, and print its resume command)."""
    import subprocess
    import time

    from tests.train.test_kill_resume import ROOT, _command

    t0 = time.perf_counter()
    p = subprocess.run(
        _command(config, out, True),
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=600,
    )
    err = p.stderr
    assert p.returncode == 130, (p.returncode, err[-3000:])
    assert time.perf_counter() - t0 < 600, err[-2000:]
    assert "resume with: jaxrl-llm train" in err and "--resume" in err, err[-2000:]
    return err


@pytest.mark.slow
def test_misbehaving_environment_and_reward_run_finishes_and_resumes_exactly(tmp_path):
    """One episode exits, one hangs, one raises (and the reward does each too): the run
    finishes; killed during an update, stopped by Ctrl-C and resumed, it equals the
    uninterrupted run (parameters bit for bit, metrics apart from timings, samples.jsonl)."""
    config = _misbehaving_config(tmp_path)
    cache = str(tmp_path / "jax_cache")
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    _run_to_end(config, straight, _env(cache))
    rows = [r for r in read_metrics(straight) if r.get("loss") is not None]
    assert [r["step"] for r in rows] == list(range(1, MAX_STEPS + 1))
    assert sum(r["env/failed"] for r in rows) >= 4 and sum(r["env/timeouts"] for r in rows) >= 1
    reward = "rewards/tests.envs.scripted:misbehaving_reward"
    assert sum(r[f"{reward}/errors"] for r in rows) >= 1
    assert sum(r[f"{reward}/timeouts"] for r in rows) >= 1
    _run_and_kill(config, killed, _env(cache, "update:2"), after_step=None, delay=0.0)
    err = _stop_with_sigint(config, killed, _env(cache, "rollout:3:INT"))
    # stopped in step 3 (its prompts drawn and sampled): step 2's checkpoint (save_every 2)
    assert "stopped by Ctrl-C (SIGINT): step " in err, err[-2000:]
    assert "saved step 2" in err or "checkpoint of step 2 kept" in err, err[-2000:]
    _run_to_end(config, killed, _env(cache), resume=True)
    _, pa, _ = restore_model(os.path.join(straight, "checkpoints"), step=MAX_STEPS)
    _, pb, _ = restore_model(os.path.join(killed, "checkpoints"), step=MAX_STEPS)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), pa, pb)
    assert _deterministic(read_metrics(killed)) == _deterministic(read_metrics(straight))
    sa = open(os.path.join(straight, "samples.jsonl")).read().splitlines()
    sb = open(os.path.join(killed, "samples.jsonl")).read().splitlines()
    assert sb == sa and len(sa) == MAX_STEPS * 8
    assert any('"info": {"note": "a string"}' in line for line in sa)
