"""Online RL across processes (issue 30 item 3): ``jaxrl-llm train`` as 2 processes × 4 CPU
devices on localhost (gloo) logs the same ``reward/mean`` and ``loss`` at every step as the
same config in 1 process × 8 devices.

Each process samples and scores its own half of every step's prompts on its own devices,
the rows are gathered to every process, and the learner's batches enter the train step as
global arrays split by rows over all 8 devices (jaxrl_llm/parallel/distributed.py). The
per-device shapes are the same in both layouts (8 rows per device), so the runs agree to
float rounding.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

import pytest
import yaml

from jaxrl_llm.train.run.logging import read_metrics
from tests.conftest import FAST_COMPILE_XLA_FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(d, algorithm: str, **extra) -> str:
    rng = random.Random(0)
    rows = []
    for _ in range(48):
        a, b = rng.sample(range(10), 2)
        rows.append({"prompt": f"{a}{b}>", "answer": str(max(a, b))})
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:40]))
    (d / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[40:]))
    cfg = dict(
        seed=0,
        max_steps=STEPS,
        algorithm=algorithm,
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        optim=dict(lr=1e-2),
        data=dict(train=str(d / "train.jsonl"), eval=str(d / "eval.jsonl"), max_length=32),
        rollout=dict(prompts_per_step=8, group_size=8, max_new_tokens=3),
        rewards=[dict(name="tests.train.toy_rewards:larger_digit")],
        eval=dict(before=False, every=0),
        checkpoint=dict(save_every=0, export_hf=False),
        logging=dict(tensorboard=False, plots=False),
        mesh=dict(data=8),
        **extra,
    )
    path = d / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _env(devices: int) -> dict:
    env = dict(os.environ)
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(k, None)
    env.update(
        JAX_PLATFORMS="cpu",
        PYTHONPATH=ROOT,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE_XLA_FLAGS}",
    )
    return env


def _train(config: str, out: str, *job: str, devices: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from jaxrl_llm.cli.main import main; sys.exit(main())",
    ]
    cmd += ["train", config, f"output_dir={out}", *job]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(devices),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(procs: list[subprocess.Popen], timeout: float = 600) -> list[str]:
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    return logs


def _two_processes_and_one(tmp_path, algorithm: str, **extra):
    config = _config(tmp_path, algorithm, **extra)
    address = f"127.0.0.1:{_free_port()}"
    two = str(tmp_path / "two")
    procs = [
        _train(
            config,
            two,
            "--coordinator",
            address,
            "--num-processes",
            "2",
            "--process-id",
            str(i),
            devices=4,
        )
        for i in range(2)
    ]
    logs = _wait(procs)
    assert "process 1 of 2, 4 local / 8 devices" in logs[1]
    one = str(tmp_path / "one")
    _wait([_train(config, one, devices=8)])
    return read_metrics(one), read_metrics(two)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo"])
def test_two_processes_log_what_one_process_logs(tmp_path, algorithm):
    one, two = _two_processes_and_one(tmp_path, algorithm)
    steps = [r for r in one if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    other = {r["step"]: r for r in two if "loss" in r}
    assert sorted(other) == list(range(1, STEPS + 1))
    rewards = {r["reward/mean"] for r in steps}
    assert len(rewards) > 1 or rewards != {0.0}  # the runs compare something
    for r in steps:
        o = other[r["step"]]
        assert o["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), r["step"]
        assert o["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), r["step"]
        assert o["data/prompts_crc32"] == r["data/prompts_crc32"]
