"""Resuming on another topology (issue 40 item 5): a run saved by 2 processes × 4 devices
continues as 1 process × 8 devices (``test_multihost_runs.py::
test_two_processes_log_what_one_process_logs``: GRPO, PPO and a multi-turn run), and a run
saved on ``mesh.fsdp=8`` continues on ``data=2 × fsdp=4`` (here). Config sizes are the whole
job's, the data order is a function of (seed, step), and orbax restores the arrays under the
new run's shardings, so the resumed steps log what an uninterrupted run logs (to float
rounding: the reductions' order follows the layout; the bounds below are stated per metric)."""

from __future__ import annotations

import pytest

from tests.train.harness import (
    edit_config,
    killed,
    online_config,
    reference_run,
    step_rows,
    train,
    wait,
)

STEPS = 4


@pytest.mark.slow
def test_fsdp_run_resumes_on_a_data_and_fsdp_mesh(tmp_path):
    """Steps 1–2 on fsdp=8 (killed in step 3), steps 3–4 on data=2 × fsdp=4 (``mesh.*``
    overrides on resume)."""
    config = online_config(tmp_path, "grpo", max_steps=STEPS)
    edit_config(
        config,
        checkpoint=dict(save_every=2, keep=2, export_hf=False),
        mesh=dict(fsdp=8),
        replace=("mesh",),
    )
    run = f"output_dir={tmp_path / 'run'}"
    killed([train(config, run, devices=8, fault="update:3")])
    wait([train(config, run, "--resume", "mesh.data=2", "mesh.fsdp=4", devices=8)])
    want, got = reference_run(config)[0], step_rows(str(tmp_path / "run"))
    assert sorted(want) == sorted(got) == list(range(1, STEPS + 1)), sorted(got)
    for k, r in want.items():
        o = got[k]
        assert o["data/prompts_crc32"] == r["data/prompts_crc32"]  # the same prompts
        assert o["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), (r, o)
        assert o["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (r, o)
