"""Resume never corrupts or crashes (issue 21 §3), through the user-facing ``jaxrl-llm train``:

- a truncated newest checkpoint is skipped (one line naming the step and why) and the run
  resumes from the newest intact one; ``convert`` of a truncated checkpoint is one line;
- PPO killed between the critic's and the policy's saves resumes from the newest step both
  hold, and saving the stale policy step again replaces it (it used to raise
  ``StepAlreadyExistsError``);
- ``--resume`` with ``max_steps`` below the checkpoint's step is refused and leaves the
  directory exactly as it was; so is a resume whose model shape changed (one line, no noise);
- a resume keeps ``config.yaml`` (the original config), writes ``config.resumed-<step>.yaml``
  beside it and lists what changed;
- a second run on an ``output_dir`` that a run holds stops with one line.
"""

from __future__ import annotations

import os
import shutil

import pytest

from jaxrl_llm.cli.main import main
from tests.train.harness import PPO, SFT, TINY, one_error_line, run_cli


def _train(capsys, config, out, *overrides, resume=False) -> tuple[int, str, str]:
    argv = ["train", config, f"output_dir={out}", *TINY, *overrides]
    return run_cli(argv + (["--resume"] if resume else []), capsys)


def _listing(d) -> list[tuple[str, int, int]]:
    """Every path under ``d`` with its size and modification time (ns)."""
    out = []
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            p = os.path.join(root, name)
            st = os.stat(p)
            out.append((os.path.relpath(p, d), st.st_size, st.st_mtime_ns))
    return sorted(out)


def _truncate_largest(step_dir) -> str:
    files = [
        os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "params")) for f in fs
    ]
    victim = max(files, key=os.path.getsize)
    with open(victim, "r+b") as f:
        f.truncate(100)
    return victim


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """A 4-step SFT run with checkpoints at steps 2 and 4 (kept: both)."""
    out = tmp_path_factory.mktemp("resume") / "run"

    rc = main(
        ["train", SFT, f"output_dir={out}", *TINY, "max_steps=4", "checkpoint.save_every=2"]
        + ["checkpoint.keep=3"]
    )
    assert rc == 0
    return out


@pytest.fixture
def run_copy(sft_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(sft_run, dst)
    return dst


def test_truncated_newest_checkpoint_is_skipped_on_resume(run_copy, capsys):
    _truncate_largest(run_copy / "checkpoints" / "4")
    rc, _, err = _train(
        capsys,
        SFT,
        run_copy,
        "max_steps=6",
        "checkpoint.save_every=2",
        "checkpoint.keep=3",
        resume=True,
    )
    assert rc == 0, err
    assert "Traceback" not in err
    assert "step 4 is unreadable" in err and "trying step 2" in err
    assert "resumed from step 2" in err
    assert sorted(int(s) for s in os.listdir(run_copy / "checkpoints") if s.isdigit()) == [2, 4, 6]


def test_convert_of_a_truncated_checkpoint_is_one_line(run_copy, tmp_path, capsys):
    for step in ("2", "4"):
        _truncate_largest(run_copy / "checkpoints" / step)
    try:
        rc = main(["convert", str(run_copy / "checkpoints"), str(tmp_path / "hf")])
    except SystemExit as e:
        rc = e.code
    _, err = capsys.readouterr()
    assert rc == 2
    line = one_error_line(err, "convert")
    assert "no readable checkpoint" in line and "step 4" in line and "step 2" in line


def test_resume_below_the_checkpoint_step_is_refused_and_changes_nothing(run_copy, capsys):
    before = _listing(run_copy)
    rc, _, err = _train(capsys, SFT, run_copy, "max_steps=2", resume=True)
    assert rc == 2
    line = one_error_line(err)
    assert "at step 4, past max_steps=2" in line and "max_steps >= 4" in line
    assert _listing(run_copy) == before


def test_resume_with_a_changed_model_shape_is_one_line(run_copy, capsys):
    before = _listing(run_copy)
    rc, _, err = _train(
        capsys, SFT, run_copy, "max_steps=6", "model.tiny.num_layers=2", resume=True
    )
    assert rc == 2
    line = one_error_line(err)
    assert "cannot restore into the given state structure" in line
    assert _listing(run_copy) == before


def test_resume_keeps_the_original_config_and_lists_changes(run_copy, capsys):
    original = (run_copy / "config.yaml").read_text()
    rc, _, err = _train(capsys, SFT, run_copy, "max_steps=5", "optim.lr=3e-4", resume=True)
    assert rc == 0, err
    assert (run_copy / "config.yaml").read_text() == original
    assert "optim.lr: 1e-05 -> 0.0003" in err and "max_steps: 4 -> 5" in err
    resumed = (run_copy / "config.resumed-4.yaml").read_text()
    assert "lr: 0.0003" in resumed and "max_steps: 5" in resumed


def test_second_run_on_a_held_output_dir_stops(tmp_path, capsys):
    import fcntl

    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)
    try:  # "another run" holds it: flock locks belong to an open file, not to a process
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        rc, _, err = _train(capsys, SFT, out, "max_steps=2")
    finally:
        os.close(fd)
    assert rc == 2
    line = one_error_line(err)
    assert "is in use by another run" in line
    assert not (out / "checkpoints").exists()
    rc, _, err = _train(capsys, SFT, out, "max_steps=2")  # released: the run goes ahead
    assert rc == 0, err


@pytest.mark.slow
def test_ppo_killed_between_critic_and_policy_saves_resumes(tmp_path, capsys):
    """The issue's repro, smaller: the critic's newest checkpoint is missing (the kill landed
    after the policy's save of that step); resume continues from the newest common step and
    saves the policy's stale step again."""
    out = tmp_path / "ppo"
    ppo = [
        "max_steps=4",
        "checkpoint.save_every=2",
        "checkpoint.keep=3",
        "rollout.prompts_per_step=4",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "data.max_length=32",
    ]
    rc, _, err = _train(capsys, PPO, out, *ppo)
    assert rc == 0, err
    shutil.rmtree(out / "critic_checkpoints" / "4")
    rc, _, err = _train(capsys, PPO, out, *ppo, resume=True)
    assert rc == 0, err
    assert "resumed from step 2" in err
    for sub in ("checkpoints", "critic_checkpoints"):
        assert sorted(int(s) for s in os.listdir(out / sub) if s.isdigit()) == [2, 4]


def test_plain_resume_with_no_checkpoint_says_it_starts_fresh(tmp_path, capsys):
    """``--resume`` on a directory with no checkpoint starts fresh, and says so in one line
    (it used to say nothing: a mistyped output_dir trained from scratch unnoticed)."""
    out = tmp_path / "run"
    rc, _, err = _train(capsys, SFT, out, "max_steps=1", resume=True)
    assert rc == 0, err[-2000:]
    said = [x for x in err.splitlines() if "no complete checkpoint" in x]
    assert said == [f"--resume: no complete checkpoint in {out / 'checkpoints'}; starting fresh"], (
        err
    )
