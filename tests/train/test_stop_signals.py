"""Stopping a run (issue 31 §1, §2): ``jaxrl-llm train`` in a subprocess, on the tiny model.

* An asynchronous run (``rollout.max_staleness: 1``) whose reward hangs stops on SIGTERM within
  seconds with exit 143, after saving the last finished step, and prints the resume command
  (before, it ignored SIGINT and needed SIGTERM or SIGKILL).
* A reward with ``on_error: raise`` that calls ``sys.exit(0)`` stops the run with exit 2 and
  one line naming the function and the row, after saving what a Ctrl-C saves (before, the run
  ended with exit 0, silently, with nothing logged or saved).

The multi-turn case (SIGINT, then resumed to the end and compared with an uninterrupted run)
is tests/envs/test_env_kill_resume.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from tests.train.test_kill_resume import ROOT, _command, _env


def _config(d, *, mode: str, reward: dict | None = None, max_staleness: int = 0) -> str:
    rows = [
        {"prompt": f"{i % 10}{(i + 3) % 10}>", "answer": "1", "reward_mode": "ok"}
        for i in range(24)
    ]
    rows[9]["reward_mode"] = mode  # step 3, its second prompt: rows 2 and 3 of the batch
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = dict(
        seed=0,
        max_steps=5,
        algorithm="grpo",
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        data=dict(train=str(d / "train.jsonl"), max_length=32, shuffle=False),
        rollout=dict(
            prompts_per_step=4, group_size=2, max_new_tokens=3, max_staleness=max_staleness
        ),
        rewards=[
            dict(
                name="tests.envs.scripted:misbehaving_reward",
                kwargs=dict(hang_s=600.0),
                **(reward or {}),
            )
        ],
        eval=dict(before=False, every=0),
        checkpoint=dict(save_every=4, keep=2, export_hf=False),
        logging=dict(tensorboard=False, plots=False),
    )
    path = d / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _run(config, out, env, *, signal_after: str | None, sig=signal.SIGTERM):
    p = subprocess.Popen(
        _command(config, out, False),
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    lines, sent = [], None
    try:
        for line in p.stderr:
            lines.append(line)
            if signal_after and line.startswith(signal_after):
                time.sleep(1.0)  # into step 3, whose reward hangs
                p.send_signal(sig)
                sent = time.perf_counter()
                break
        lines.append(p.stderr.read())
        p.wait(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, "".join(lines), None if sent is None else time.perf_counter() - sent


@pytest.mark.slow
def test_sigterm_stops_an_async_run_whose_reward_hangs(tmp_path, jax_cache_dir):
    config = _config(tmp_path, mode="hang", max_staleness=1)
    out = str(tmp_path / "out")
    rc, err, seconds = _run(config, out, _env(jax_cache_dir), signal_after="step 2/")
    assert rc == 143, err[-3000:]
    assert seconds is not None and seconds < 20, (seconds, err[-2000:])
    assert "jaxrl-llm train: stopped by SIGTERM: step 3: saved step 2" in err, err[-2000:]
    assert f"resume with: jaxrl-llm train {config} output_dir={out} --resume auto" in err
    assert "Traceback" not in err
    assert sorted(int(s) for s in os.listdir(os.path.join(out, "checkpoints")) if s.isdigit()) == [
        2
    ]


@pytest.mark.slow
def test_reward_on_error_raise_stops_with_one_line_after_saving(tmp_path, jax_cache_dir):
    config = _config(tmp_path, mode="exit", reward=dict(on_error="raise"))
    out = str(tmp_path / "out")
    rc, err, _ = _run(config, out, _env(jax_cache_dir), signal_after=None)
    assert rc == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("jaxrl-llm train: error: reward function "), err[-2000:]
    assert "misbehaving_reward' failed on row 2: SystemExit: 0" in last
    assert last.endswith(f"saved step 2 in {out}/checkpoints"), last
    assert "Traceback" not in err
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2]
