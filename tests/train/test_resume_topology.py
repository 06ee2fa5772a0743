"""Resuming on another topology (issue 40 item 5): a run saved by 2 processes × 4 devices
continues as 1 process × 8 devices, and a run saved on ``mesh.fsdp=8`` continues on
``data=2 × fsdp=4``. Config sizes are the whole job's, the data order is a function of
(seed, step), and orbax restores the arrays under the new run's shardings, so the resumed
steps log what an uninterrupted run logs (to float rounding: the reductions' order follows the
layout; the bounds below are stated per metric)."""

from __future__ import annotations

import pytest
import yaml

from jaxrl_llm.train.run.logging import read_metrics
from tests.train.test_multihost_runs import _config, _job, _train, _wait

STEPS = 4


@pytest.fixture(autouse=True)
def _shared_compile_cache(jax_cache_dir):
    from tests.train import test_multihost_runs

    test_multihost_runs._CACHE[:] = [jax_cache_dir]


def _saving(tmp_path, algorithm: str = "grpo", chat: bool = False, **mesh) -> str:
    config = _config(tmp_path, algorithm, chat=chat, max_steps=STEPS)
    cfg = yaml.safe_load(open(config))
    cfg["checkpoint"] = dict(save_every=2, keep=2, export_hf=False)
    if mesh:
        cfg["mesh"] = mesh
    with open(config, "w") as f:
        yaml.safe_dump(cfg, f)
    return config


def _killed(procs) -> None:
    for p in procs:
        p.communicate(timeout=600)
    assert {p.returncode for p in procs} == {-9}, [p.returncode for p in procs]


def _same_steps(want_dir: str, got_dir: str) -> None:
    want = [r for r in read_metrics(want_dir) if r.get("loss") is not None]
    got = {r["step"]: r for r in read_metrics(got_dir) if r.get("loss") is not None}
    assert [r["step"] for r in want] == list(range(1, STEPS + 1))
    assert sorted(got) == list(range(1, STEPS + 1)), sorted(got)
    for r in want:
        o = got[r["step"]]
        assert o["data/prompts_crc32"] == r["data/prompts_crc32"]  # the same prompts
        assert o["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), (r, o)
        assert o["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (r, o)


@pytest.mark.slow
@pytest.mark.parametrize(
    "algorithm, chat", [("grpo", False), ("ppo", False), ("grpo", True)], ids=["grpo", "ppo", "env"]
)
def test_two_process_run_resumes_as_one_process(tmp_path, algorithm, chat):
    """Steps 1–2 as 2 × 4 (checkpoint at 2), killed in step 3's update; steps 3–4 as 1 × 8
    with ``--resume`` (PPO: its critic restored beside the policy; env: multi-turn)."""
    config = _saving(tmp_path, algorithm, chat)
    run = str(tmp_path / "run")
    _killed(_job(config, run, fault="update:3"))
    _wait([_train(config, run, "--resume", devices=8)])
    one = str(tmp_path / "one")
    _wait([_train(config, one, devices=8)])
    _same_steps(one, run)


@pytest.mark.slow
def test_fsdp_run_resumes_on_a_data_and_fsdp_mesh(tmp_path):
    """Steps 1–2 on fsdp=8 (killed in step 3), steps 3–4 on data=2 × fsdp=4 (``mesh.*``
    overrides on resume)."""
    config = _saving(tmp_path, fsdp=8)
    run = str(tmp_path / "run")
    _killed([_train(config, run, devices=8, fault="update:3")])
    _wait([_train(config, run, "--resume", "mesh.data=2", "mesh.fsdp=4", devices=8)])
    one = str(tmp_path / "one")
    _wait([_train(config, one, devices=8)])
    _same_steps(one, run)
