"""A run a signal stops still writes its plots and ``summary.json`` (issue 53, item 10)."""

from __future__ import annotations

import json
import os

import pytest

from tests.train.harness import SFT, TINY, run_cli


@pytest.mark.slow
def test_a_stopped_run_writes_plots_and_summary(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("JAXRL_LLM_FAULT", "update:2:TERM")
    args = [*TINY, "logging.plots=true", "max_steps=4", "checkpoint.save_every=100"]
    rc, _, err = run_cli(["train", SFT, f"output_dir={out}", *args], capsys)
    assert rc == 143, err[-2000:]
    with open(out / "summary.json", encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["exit_status"] == 143 and summary["start_step"] == 0, summary
    assert "saved step 2" in summary["stopped"], summary
    assert "overview.png" in os.listdir(out / "plots"), sorted(os.listdir(out))


@pytest.mark.slow
def test_a_stop_keeps_the_last_finished_step_even_right_after_a_save(tmp_path, capsys, monkeypatch):
    """SIGTERM in step 5's update with save_every=4: step 5 finishes and is saved beside step
    4 (a checkpoint within save_every / 2 steps used to stand in for it: step 5 was lost)."""
    from jaxrl_llm.train.run.checkpoint_steps import complete_steps

    out = tmp_path / "run"
    monkeypatch.setenv("JAXRL_LLM_FAULT", "update:5:TERM")
    args = [*TINY, "max_steps=8", "checkpoint.save_every=4", "checkpoint.keep=3"]
    rc, _, err = run_cli(["train", SFT, f"output_dir={out}", *args], capsys)
    assert rc == 143, err[-2000:]
    assert f"saved step 5 in {out / 'checkpoints'}" in err, err[-2000:]
    assert complete_steps(out / "checkpoints") == [4, 5]
