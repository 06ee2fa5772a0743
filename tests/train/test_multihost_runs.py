"""Training runs across processes (issue 30 item 3): ``jaxrl-llm train`` as 2 processes × 4 CPU
devices on localhost (gloo) logs the same ``reward/mean`` and ``loss`` at every step as the
same config in 1 process × 8 devices.

Each process samples and scores its own half of every step's prompts on its own devices and
keeps those rows (host-local); they enter the programs as its part of global arrays split by
rows over all 8 devices, and only numbers (metrics, per-row rewards and lengths) go between
the hosts outside the programs (jaxrl_llm/parallel/host_rows.py). The per-device shapes are
the same in both layouts (8 rows per device), so the runs agree to float rounding.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

import numpy as np
import pytest
import yaml

from jaxrl_llm.train.run.logging import read_metrics
from tests.conftest import FAST_COMPILE_XLA_FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(d, algorithm: str, *, chat: bool = False, max_steps: int = STEPS, **extra) -> str:
    rng = random.Random(0)
    rows = []
    for _ in range(48):
        a, b = rng.sample(range(10), 2)
        prompt = [{"role": "user", "content": f"{a}{b}>"}] if chat else f"{a}{b}>"
        rows.append({"prompt": prompt, "answer": str(max(a, b))})
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:40]))
    (d / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[40:]))
    cfg = dict(
        seed=0,
        max_steps=max_steps,
        algorithm=algorithm,
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        optim=dict(lr=1e-2),
        data=dict(train=str(d / "train.jsonl"), eval=str(d / "eval.jsonl"), max_length=32),
        rollout=dict(
            prompts_per_step=8, group_size=8 if algorithm != "online_dpo" else 4, max_new_tokens=3
        ),
        rewards=[dict(name="tests.train.toy_rewards:larger_digit")],
        eval=dict(before=False, every=0),
        checkpoint=dict(save_every=0, export_hf=False),
        logging=dict(tensorboard=False, plots=False),
        mesh=dict(data=8),
        **extra,
    )
    if chat:  # a multi-turn run: a scripted environment answers each turn
        cfg["rollout"]["max_new_tokens"] = 24
        cfg["env"] = dict(
            name="tests.envs.scripted:Scripted",
            kwargs=dict(replies=["ok"]),
            max_turns=2,
            max_turn_tokens=6,
        )
    path = d / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


_CACHE: list[str] = []  # the session's persistent compilation cache (tests/conftest.py)


@pytest.fixture(autouse=True)
def _shared_compile_cache(jax_cache_dir):
    """The children share compiled programs: the job's two processes compile the same ones."""
    _CACHE[:] = [jax_cache_dir]


def _env(devices: int, fault: str | None = None) -> dict:
    env = dict(os.environ)
    if _CACHE:
        env.update(
            JAX_COMPILATION_CACHE_DIR=_CACHE[0],
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
        )
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAXRL_LLM_FAULT"):
        env.pop(k, None)
    if fault:
        env["JAXRL_LLM_FAULT"] = fault
    env.update(
        JAX_PLATFORMS="cpu",
        PYTHONPATH=ROOT,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE_XLA_FLAGS}",
    )
    return env


def _train(
    config: str, out: str, *job: str, devices: int, fault: str | None = None
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-c",
        "import sys; from jaxrl_llm.cli.main import main; sys.exit(main())",
    ]
    cmd += ["train", config, f"output_dir={out}", *job]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(devices, fault),
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
    for p in procs:
        assert p.returncode == 0, "\n----\n".join(x[-2500:] for x in logs)
    return logs


def _job(config: str, out: str, *extra: str, fault: str | None = None) -> list[subprocess.Popen]:
    """A 2-process job (4 CPU devices each, gloo on localhost) running ``config`` into ``out``."""
    address = f"127.0.0.1:{_free_port()}"
    job = ("--coordinator", address, "--num-processes", "2")
    return [
        _train(config, out, *job, "--process-id", str(i), *extra, devices=4, fault=fault)
        for i in range(2)
    ]


def _two_processes_and_one(tmp_path, algorithm: str, **extra):
    config = _config(tmp_path, algorithm, **extra)
    two = str(tmp_path / "two")
    logs = _wait(_job(config, two))
    assert "process 1 of 2, 4 local / 8 devices" in logs[1]
    one = str(tmp_path / "one")
    _wait([_train(config, one, devices=8)])
    return read_metrics(one), read_metrics(two)


@pytest.mark.slow
@pytest.mark.parametrize(
    "algorithm, chat",
    [("grpo", False), ("ppo", False), ("online_dpo", False), ("grpo", True)],
    ids=["grpo", "ppo", "online_dpo", "env"],
)
def test_two_processes_log_what_one_process_logs(tmp_path, algorithm, chat):
    one, two = _two_processes_and_one(tmp_path, algorithm, chat=chat)
    steps = [r for r in one if r.get("loss") is not None]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    other = {r["step"]: r for r in two if r.get("loss") is not None}
    assert sorted(other) == list(range(1, STEPS + 1))
    rewards = {r["reward/mean"] for r in steps}
    assert len(rewards) > 1 or rewards != {0.0}  # the runs compare something
    for r in steps:
        o = other[r["step"]]
        assert o["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), (r, o)
        assert o["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (r, o)
        assert o["data/prompts_crc32"] == r["data/prompts_crc32"]
        # numbers, not rows, between the hosts: less than 8 int32 token columns of the step;
        # the first step also agrees the metric names (a few hundred bytes of text)
        rows = 8 * (8 if algorithm != "online_dpo" else 4)
        names = 4096 if r["step"] == 1 else 0
        assert 0 < o["hosts/exchanged_bytes"] < rows * 4 * 8 + names, o
        if r["step"] > 1:  # the names are agreed: one exchange per metrics merge, 6 in all
            assert o["hosts/collectives"] <= 6, o["hosts/collectives"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "algorithm, rollout",
    [
        ("grpo", dict(minibatches=2, epochs=2, advantage_scale="batch")),
        ("reinforce_pp", dict(minibatches=2)),
        ("remax", {}),
        ("grpo", dict(correction=dict(level="token", high=2.0))),
    ],
    ids=["minibatches_batch_scale", "reinforce_pp", "remax", "correction"],
)
def test_two_processes_train_on_the_whole_step(tmp_path, algorithm, rollout):
    """What needs the whole step across hosts: minibatches drawn from every process's rows
    (a program gathers them; with zero-advantage skipping their groups are laid out by the
    gathered per-row flags), GRPO's batch std and REINFORCE++'s batch whitening (programs
    on the global rows), ReMax's greedy baseline (each process samples its own prompts'),
    the rollout correction's recompute (as many rows on every process): the job logs what 1
    process × 8 devices logs."""
    config = _config(tmp_path, algorithm)
    cfg = yaml.safe_load(open(config))
    cfg["rollout"].update(rollout)
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    two, one = str(tmp_path / "two"), str(tmp_path / "one")
    _wait(_job(config, two))
    _wait([_train(config, one, devices=8)])
    want = {r["step"]: r for r in read_metrics(one) if r.get("loss") is not None}
    got = {r["step"]: r for r in read_metrics(two) if r.get("loss") is not None}
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for k, r in want.items():
        for key in ("reward/mean", "reward/std", "advantage/mean", "advantage/std"):
            assert got[k][key] == pytest.approx(r[key], rel=1e-4, abs=1e-5), (key, r, got[k])
        assert got[k]["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (r, got[k])
        if "correction/weight_max" in r:
            assert got[k]["correction/weight_max"] == pytest.approx(r["correction/weight_max"])


@pytest.mark.slow
def test_two_processes_sample_dynamically_each_its_share(tmp_path):
    """DAPO's dynamic sampling across processes: each process keeps its share of the step's
    groups from its own prompts, the rounds go on until both have theirs (every process
    draws the same prompts), and the step trains on prompts_per_step groups."""
    config = _config(tmp_path, "dapo")
    cfg = yaml.safe_load(open(config))
    cfg["rollout"].update(dynamic_sampling=True, max_sampling_rounds=3)
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    two = str(tmp_path / "two")
    _wait(_job(config, two))
    rows = [r for r in read_metrics(two) if r.get("loss") is not None]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["dynamic/groups_kept"] + r["dynamic/groups_filled"] == 8, r
        assert 1 <= r["dynamic/rounds"] <= 3
        assert np.isfinite(r["loss"])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::jaxrl_llm.parallel.ShardingFallbackWarning")
@pytest.mark.parametrize(
    "tensor, heads, two_line, one_line",
    [
        (2, 4, "data=2 × tensor=2 per process", "data=4 × tensor=2"),
        (8, 8, "tensor=8 over 2 processes", "tensor=8"),
    ],
    ids=["within_each_host", "over_both"],
)
def test_two_processes_sample_on_a_tensor_parallel_copy(
    tmp_path, tensor, heads, two_line, one_line
):
    """rollout.tensor=2 (4 heads, 2 KV heads): each process's sampler is 2 replicas × tensor
    2 on its own 4 devices; rollout.tensor=8 (8 heads and KV heads): one sampler program over
    both processes' devices. Either copy is made by one reshard program over the job, and
    the job logs what 1 process × 8 devices logs with the same sampler layout."""
    config = _config(tmp_path, "grpo")
    cfg = yaml.safe_load(open(config))
    cfg["model"]["tiny"].update(num_heads=heads, num_kv_heads=heads // 2 if tensor < 8 else 8)
    cfg["rollout"]["tensor"] = tensor
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    two = str(tmp_path / "two")
    logs = _wait(_job(config, two))
    said = [line for line in logs[0].splitlines() if "sampler" in line]  # process 0 speaks
    assert any(f"sampler: {two_line} on devices 0..7" in line for line in said), said
    one = str(tmp_path / "one")
    (log_one,) = _wait([_train(config, one, devices=8)])
    said = [line for line in log_one.splitlines() if "sampler" in line]
    assert any(f"sampler: {one_line} on devices 0..7" in line for line in said), said
    want = {r["step"]: r for r in read_metrics(one) if r.get("loss") is not None}
    got = {r["step"]: r for r in read_metrics(two) if r.get("loss") is not None}
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for k, r in want.items():
        assert got[k]["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6)
        assert got[k]["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_two_process_run_killed_and_resumed_equals_an_uninterrupted_one(tmp_path):
    """Both processes are SIGKILLed in step 3's update (after step 2's checkpoint), as a
    preempted job dies; ``--resume`` on both continues from step 2 and the run logs what an
    uninterrupted run (1 process × 8 devices) logs, each step once."""
    steps = 4
    config = _config(tmp_path, "grpo", max_steps=steps)
    cfg = yaml.safe_load(open(config))
    cfg["checkpoint"] = dict(save_every=1, keep=2, export_hf=False)
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    two = str(tmp_path / "two")

    killed = _job(config, two, fault="update:3")
    for p in killed:
        p.communicate(timeout=600)
    assert {p.returncode for p in killed} == {-9}, [p.returncode for p in killed]
    _wait(_job(config, two, "--resume"))
    one = str(tmp_path / "one")
    _wait([_train(config, one, devices=8)])
    want = [r for r in read_metrics(one) if r.get("loss") is not None]
    got = [r for r in read_metrics(two) if r.get("loss") is not None]
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, steps + 1))
    for r, o in zip(want, got):
        assert o["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), (r, o)
        assert o["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (r, o)
        assert o["data/prompts_crc32"] == r["data/prompts_crc32"]


@pytest.mark.slow
def test_two_process_offline_run_logs_what_one_process_logs(tmp_path):
    """Offline (SFT): ``train.batch_size`` is the job's; both processes read the same
    batches and the train step takes them as global arrays split by rows."""
    rng = random.Random(1)
    rows = []
    for _ in range(40):
        a, b = rng.sample(range(10), 2)
        rows.append({"prompt": f"{a}{b}>", "completion": str(max(a, b))})
    (tmp_path / "sft.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:32]))
    (tmp_path / "sft_eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[32:]))
    cfg = dict(
        seed=0,
        max_steps=3,
        algorithm="sft",
        model=dict(source="tiny", tokenizer="char", tiny=dict(num_layers=1)),
        optim=dict(lr=1e-2),
        data=dict(
            train=str(tmp_path / "sft.jsonl"), eval=str(tmp_path / "sft_eval.jsonl"), max_length=16
        ),
        train=dict(batch_size=8, eval_every=3, eval_batches=1),
        checkpoint=dict(save_every=0, export_hf=False),
        logging=dict(tensorboard=False, plots=False),
        mesh=dict(data=8),
    )
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump(cfg))
    two, one = str(tmp_path / "two"), str(tmp_path / "one")
    _wait(_job(str(config), two))
    _wait([_train(str(config), one, devices=8)])
    want = [r for r in read_metrics(one) if r.get("loss") is not None]
    got = [r for r in read_metrics(two) if r.get("loss") is not None]
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3]
    for r, o in zip(want, got):
        assert o["loss"] == pytest.approx(r["loss"], rel=1e-5), (r, o)
    evals = [r for r in read_metrics(two) if r.get("eval/loss") is not None]
    assert evals and evals[-1]["eval/loss"] == pytest.approx(
        [r for r in read_metrics(one) if r.get("eval/loss") is not None][-1]["eval/loss"], rel=1e-5
    )


@pytest.mark.slow
def test_two_process_async_run_trains_within_its_staleness_bound(tmp_path):
    """``rollout.max_staleness: 1`` across processes: each process's background sampler
    samples and scores its own share and keeps it (host-local: nothing crosses hosts off
    the learner's thread); every step trains on a batch at most 1 step old.
    Versions depend on timing, so the run is not compared bit for bit."""
    steps = 4
    config = _config(tmp_path, "grpo", max_steps=steps)
    cfg = yaml.safe_load(open(config))
    cfg["rollout"]["max_staleness"] = 1
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    two = str(tmp_path / "two")
    _wait(_job(config, two))
    rows = [r for r in read_metrics(two) if r.get("loss") is not None]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert any(r["async/staleness_max"] == 1 for r in rows)  # it did run ahead
    assert all(np.isfinite(r["loss"]) for r in rows)
