"""Long phases say when they start and end, with their time (issue 53, item 9):
``jaxrl_llm/train/run/progress.py``."""

from __future__ import annotations

import re

import pytest

from jaxrl_llm.train.run.progress import ENV_PROGRESS, bar, bars_on, phase
from tests.train.harness import SFT, TINY, run_cli


def test_a_phase_says_start_and_end_with_its_time():
    said: list[str] = []
    with phase("model load", said.append):
        pass
    with pytest.raises(ValueError), phase("compile", said.append):
        raise ValueError("x")
    assert said[0] == "model load: started" and said[2] == "compile: started"
    assert re.fullmatch(r"model load: done in \d+\.\d s", said[1]), said
    assert re.fullmatch(r"compile: failed after \d+\.\d s", said[3]), said


def test_bars_are_off_in_a_log_unless_asked(monkeypatch, capsys):
    monkeypatch.delenv(ENV_PROGRESS, raising=False)
    assert not bars_on()  # pytest's stderr is not a terminal
    assert list(bar(range(3), total=3, desc="x")) == [0, 1, 2]
    assert "x:" not in capsys.readouterr().err
    monkeypatch.setenv(ENV_PROGRESS, "1")
    assert bars_on() and list(bar(range(3), total=3, desc="x")) == [0, 1, 2]
    assert "x:   0%|" in capsys.readouterr().err  # tqdm's bar (leave=False: cleared at the end)


@pytest.mark.slow
def test_a_run_reports_model_load_and_eval(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(ENV_PROGRESS, "1")
    args = [a for a in TINY if a != "data.eval=null"] + ["max_steps=2", "train.eval_every=1"]
    rc, out, err = run_cli(["train", SFT, f"output_dir={tmp_path / 'run'}", *args], capsys)
    assert rc == 0, err[-2000:]
    assert "eval batches:" in err, err[-3000:]  # the bar, asked for in a log
    lines = (out + err).splitlines()
    for name in ("model load (tiny)", "eval at step 1", "eval after training"):
        assert f"{name}: started" in lines, (name, lines)
        assert any(re.fullmatch(rf"{re.escape(name)}: done in \d+\.\d s", x) for x in lines), (
            name,
            lines,
        )
