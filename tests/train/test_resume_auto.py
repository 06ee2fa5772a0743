"""``--resume auto`` (issue 40 item 4): resume when ``output_dir`` holds a complete checkpoint,
start fresh otherwise, and say which; a step still being written (orbax's temporary folder) is
never complete. The resume line keeps a job's flags."""

from __future__ import annotations

import argparse
import shutil

import pytest

from jaxrl_llm.cli.main import main
from jaxrl_llm.cli.train import resume_command
from jaxrl_llm.train.run.checkpoint_steps import complete_steps
from tests.train.harness import CHECKPOINTED as TINY
from tests.train.harness import SFT, run_cli


def _train(capsys, out, *args) -> tuple[int, str]:
    rc, _, err = run_cli(["train", SFT, f"output_dir={out}", *TINY, *args], capsys)
    return rc, err


@pytest.mark.slow
def test_resume_auto_starts_fresh_resumes_and_skips_a_partial_step(tmp_path, capsys):
    out = tmp_path / "run"
    rc, err = _train(capsys, out, "max_steps=4", "--resume", "auto")
    assert rc == 0, err[-2000:]
    assert "resume auto: no complete checkpoint" in err and "starting fresh" in err, err[-2000:]
    ckpt = out / "checkpoints"
    assert complete_steps(ckpt) == [2, 4]

    # a step 6 that a killed job was still writing: orbax's temporary folder, not a step
    partial = ckpt / "6.orbax-checkpoint-tmp-1234567"
    shutil.copytree(ckpt / "4", partial)
    assert complete_steps(ckpt) == [2, 4]
    rc, err = _train(capsys, out, "max_steps=6", "--resume", "auto")
    assert rc == 0, err[-2000:]
    assert "resumed from step 4 (resume auto: the newest complete checkpoint)" in err, err[-2000:]
    assert complete_steps(ckpt)[-1] == 6

    # only a partial checkpoint: a fresh start, said
    fresh = tmp_path / "fresh"
    (fresh / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt / "6", fresh / "checkpoints" / "2.orbax-checkpoint-tmp-99")
    rc, err = _train(capsys, fresh, "max_steps=2", "resume=auto")
    assert rc == 0, err[-2000:]
    assert "resume auto: no complete checkpoint" in err, err[-2000:]


def test_resume_flag_takes_auto_or_an_override_after_it(tmp_path, capsys):
    """``--resume`` followed by an override still reads the override (the form used before
    ``--resume`` took a value); ``--resume maybe`` is one line."""
    out = tmp_path / "x"
    rc = main(["train", SFT, f"output_dir={out}", *TINY, "--dry-run", "--resume", "max_steps=7"])
    text = capsys.readouterr().out
    assert rc == 0 and "max_steps: 7" in text and "resume: true" in text, text[-1500:]
    rc = main(["train", SFT, f"output_dir={out}", *TINY, "--dry-run", "--resume", "auto"])
    assert rc == 0 and "resume: auto" in capsys.readouterr().out
    rc = main(["train", SFT, f"output_dir={out}", *TINY, "--dry-run", "--resume", "maybe"])
    assert rc == 2 and "--resume 'maybe'" in capsys.readouterr().err


def test_resume_command_keeps_the_jobs_flags():
    args = argparse.Namespace(
        config="c.yaml",
        overrides=["max_steps=9", "resume=true"],
        coordinator="10.0.0.2:8476",
        num_processes=4,
        process_id=3,
        connect_timeout=None,
    )
    assert resume_command(args) == (
        "jaxrl-llm train c.yaml max_steps=9 --coordinator 10.0.0.2:8476 --num-processes 4 "
        "--process-id 3 --resume auto"
    )
    single = argparse.Namespace(config="c.yaml", overrides=[])
    assert resume_command(single) == "jaxrl-llm train c.yaml --resume auto"
