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

import numpy as np
import pytest
import yaml

from jaxrl_llm.train.run.logging import read_metrics
from tests.train.harness import (
    edit_config,
    job,
    killed,
    online_config,
    reference_run,
    step_rows,
    train,
    wait,
)

STEPS = 2


def _same_steps(want: dict[int, dict], got: dict[int, dict], steps: int) -> None:
    """The runs trained on the same prompts and logged the same reward and loss each step."""
    assert sorted(want) == sorted(got) == list(range(1, steps + 1)), (sorted(want), sorted(got))
    for k, r in want.items():
        o = got[k]
        assert o["data/prompts_crc32"] == r["data/prompts_crc32"]
        assert o["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), (r, o)
        assert o["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (r, o)


def _each_process_wrote_its_samples(run: str, rows: dict[int, dict], *, group: int) -> None:
    """``samples.jsonl`` holds process 0's rows of each step and ``samples.process-1.jsonl``
    process 1's (no row crossed hosts): 4 prompts × G each, different prompts, together the
    step's 8 prompts and the rewards whose mean the step logged."""
    files = [os.path.join(run, "samples.jsonl"), os.path.join(run, "samples.process-1.jsonl")]
    lines = [[json.loads(x) for x in open(f, encoding="utf-8")] for f in files]
    for step, r in rows.items():
        mine = [[x for x in part if x["step"] == step] for part in lines]
        assert [len(m) for m in mine] == [4 * group, 4 * group], [len(m) for m in mine]
        prompts = [{x["prompt_id"] for x in m} for m in mine]
        assert len(prompts[0]) == len(prompts[1]) == 4 and not prompts[0] & prompts[1], prompts
        rewards = [x["reward"] or 0.0 for m in mine for x in m]
        assert np.mean(rewards) == pytest.approx(r["reward/mean"], abs=1e-6), (step, r)


@pytest.mark.slow
@pytest.mark.parametrize(
    "algorithm, chat",
    # one per strategy with state of its own across hosts (PPO's critic, an environment's
    # episodes); online DPO's pairs take the rows path GRPO takes (dropped from the suite:
    # 70 s on a 2-core host)
    [("grpo", False), ("ppo", False), ("grpo", True)],
    ids=["grpo", "ppo", "env"],
)
def test_two_processes_log_what_one_process_logs(tmp_path, algorithm, chat):
    """Steps 1–2 as 2 processes × 4 devices log what 1 process × 8 devices logs, only
    numbers go between the hosts (two exchanges a step once the metric names are agreed),
    and each process writes the samples it drew (``logging.samples_every``). GRPO, PPO and the multi-turn run (env) save step 2 and are
    killed in step 3's update; steps 3–4 continue as 1 process × 8 devices with ``--resume``
    (issue 40 item 5: resuming on another topology; PPO's critic is restored beside the
    policy) and log what the uninterrupted run logs."""
    steps = 4
    config = online_config(tmp_path, algorithm, chat=chat, max_steps=steps)
    edit_config(config, checkpoint=dict(save_every=2, keep=2, export_hf=False))
    run = str(tmp_path / "run")
    samples = "logging.samples_every=1"  # not the reference's: it does not change the metrics
    procs = job(config, run, samples, fault="update:3")
    logs = killed(procs)
    assert "process 1 of 2, 4 local / 8 devices" in logs[1]
    want = reference_run(config)[0]
    two = step_rows(run)
    _same_steps({k: want[k] for k in range(1, STEPS + 1)}, two, STEPS)
    _each_process_wrote_its_samples(run, two, group=8)
    rewards = {r["reward/mean"] for r in want.values()}
    assert len(rewards) > 1 or rewards != {0.0}  # the runs compare something
    for step, o in two.items():
        # numbers, not rows, between the hosts: less than 8 int32 token columns of the step;
        # the first step also agrees the metric names (a few hundred bytes of text)
        rows = 8 * 8
        names = 4096 if step == 1 else 0
        assert 0 < o["hosts/exchanged_bytes"] < rows * 4 * 8 + names, o
        if step > 1:  # the names are agreed: one exchange after sampling, one after prepare
            assert o["hosts/collectives"] == 2, o["hosts/collectives"]
    (log,) = wait([train(config, f"output_dir={run}", "--resume", devices=8)])
    assert "resumed from step 2" in log, log[-3000:]
    _same_steps(want, step_rows(run), steps)


@pytest.mark.slow
@pytest.mark.parametrize(
    "algorithm, rollout",
    [
        (
            "grpo",
            dict(
                minibatches=2,
                epochs=2,
                advantage_scale="batch",
                correction=dict(level="token", high=2.0),
            ),
        ),
        ("reinforce_pp", dict(minibatches=2)),
        ("remax", {}),
    ],
    ids=["minibatches_batch_scale_correction", "reinforce_pp", "remax"],
)
def test_two_processes_train_on_the_whole_step(tmp_path, algorithm, rollout):
    """What needs the whole step across hosts: minibatches drawn from every process's rows
    (a program gathers them; with zero-advantage skipping their groups are laid out by the
    gathered per-row flags), GRPO's batch std and REINFORCE++'s batch whitening (programs
    on the global rows), ReMax's greedy baseline (each process samples its own prompts'),
    the rollout correction's recompute (as many rows on every process; in the minibatch
    run): the job logs what 1 process × 8 devices logs."""
    config = edit_config(online_config(tmp_path, algorithm), rollout=rollout)
    two = str(tmp_path / "two")
    wait(job(config, two))
    want, got = reference_run(config)[0], step_rows(two)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for k, r in want.items():
        for key in ("reward/mean", "reward/std", "advantage/mean", "advantage/std"):
            assert got[k][key] == pytest.approx(r[key], rel=1e-4, abs=1e-5), (key, r, got[k])
        assert got[k]["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (r, got[k])
        if "correction" in rollout:
            assert got[k]["correction/weight_max"] == pytest.approx(r["correction/weight_max"])


@pytest.mark.slow
def test_two_processes_sample_dynamically_each_its_share(tmp_path):
    """DAPO's dynamic sampling across processes: each process keeps its share of the step's
    groups from its own prompts, the rounds go on until both have theirs (every process
    draws the same prompts), and the step trains on prompts_per_step groups."""
    config = online_config(tmp_path, "dapo")
    edit_config(config, rollout=dict(dynamic_sampling=True, max_sampling_rounds=3))
    two = str(tmp_path / "two")
    wait(job(config, two))
    rows = list(step_rows(two).values())
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["dynamic/groups_kept"] + r["dynamic/groups_filled"] == 8, r
        assert 1 <= r["dynamic/rounds"] <= 3
        assert np.isfinite(r["loss"])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::jaxrl_llm.parallel.ShardingFallbackWarning")
@pytest.mark.parametrize(
    "tensor, heads, two_line, one_line",
    # the copy spanning both hosts (a copy within each host is the single-process layout on
    # each: tests/parallel/test_placement_map.py; its 2-process case took 86 s of the suite)
    [(8, 8, "tensor=8 over 2 processes", "tensor=8")],
    ids=["over_both"],
)
def test_two_processes_sample_on_a_tensor_parallel_copy(
    tmp_path, tensor, heads, two_line, one_line
):
    """rollout.tensor=2 (4 heads, 2 KV heads): each process's sampler is 2 replicas × tensor
    2 on its own 4 devices; rollout.tensor=8 (8 heads and KV heads): one sampler program over
    both processes' devices. Either copy is made by one reshard program over the job, and
    the job logs what 1 process × 8 devices logs with the same sampler layout."""
    config = online_config(tmp_path, "grpo")
    edit_config(
        config,
        model=dict(
            source="tiny",
            tokenizer="char",
            tiny=dict(num_layers=1, num_heads=heads, num_kv_heads=heads // 2 if tensor < 8 else 8),
        ),
        rollout=dict(tensor=tensor),
    )
    two = str(tmp_path / "two")
    logs = wait(job(config, two))
    said = [line for line in logs[0].splitlines() if "sampler" in line]  # process 0 speaks
    assert any(f"sampler: {two_line} on devices 0..7" in line for line in said), said
    want, _, log_one = reference_run(config)
    said = [line for line in log_one.splitlines() if "sampler" in line]
    assert any(f"sampler: {one_line} on devices 0..7" in line for line in said), said
    got = step_rows(two)
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
    config = online_config(tmp_path, "grpo", max_steps=steps)
    edit_config(config, checkpoint=dict(save_every=1, keep=2, export_hf=False))
    two = str(tmp_path / "two")
    killed(job(config, two, fault="update:3"))
    wait(job(config, two, "--resume"))
    got = [r for r in read_metrics(two) if r.get("loss") is not None]
    assert [r["step"] for r in got] == list(range(1, steps + 1))  # each step once
    _same_steps(reference_run(config)[0], step_rows(two), steps)


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
    two = str(tmp_path / "two")
    wait(job(str(config), two))
    want, one, _ = reference_run(str(config))
    got = step_rows(two)
    assert sorted(got) == sorted(want) == [1, 2, 3]
    for k, r in want.items():
        assert got[k]["loss"] == pytest.approx(r["loss"], rel=1e-5), (r, got[k])
    evals = [r for r in read_metrics(two) if r.get("eval/loss") is not None]
    assert evals and evals[-1]["eval/loss"] == pytest.approx(
        [r for r in one if r.get("eval/loss") is not None][-1]["eval/loss"], rel=1e-5
    )


@pytest.mark.slow
def test_two_process_async_run_trains_within_its_staleness_bound(tmp_path):
    """``rollout.max_staleness: 1`` across processes: each process's background sampler
    samples and scores its own share and keeps it (host-local: nothing crosses hosts off
    the learner's thread); every step trains on a batch at most 1 step old, and on the same
    prompts as one process × 8 devices. Which policy version sampled a batch depends on
    timing (one process's async run too), so rewards and losses are not compared."""
    steps = 4
    config = online_config(tmp_path, "grpo", max_steps=steps)
    edit_config(config, rollout=dict(max_staleness=1))
    two = str(tmp_path / "two")
    wait(job(config, two))
    rows = list(step_rows(two).values())
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    want = reference_run(config)[0]
    assert [r["data/prompts_crc32"] for r in rows] == [
        want[r["step"]]["data/prompts_crc32"] for r in rows
    ]
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert any(r["async/staleness_max"] == 1 for r in rows)  # it did run ahead
    assert all(np.isfinite(r["loss"]) for r in rows)
