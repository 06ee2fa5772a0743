"""``--resume auto`` (issue 40 item 4): resume when ``output_dir`` holds a complete checkpoint,
start fresh otherwise, and say which; a step still being written (orbax's temporary folder) is
never complete. The resume line keeps a job's flags. The peer watch of a multi-process job
(``parallel/peers.py``) and the job checks' pure parts (``train/run/job.py``)."""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import threading

import pytest

from jaxrl_llm.cli.main import main
from jaxrl_llm.cli.train import resume_command
from jaxrl_llm.errors import ConfigError
from jaxrl_llm.parallel.distributed import coordinator_host_port
from jaxrl_llm.parallel.peers import LOST_EXIT_STATUS, PeerWatch
from jaxrl_llm.train.run.checkpoint import complete_steps
from jaxrl_llm.train.run.job import first_difference, flat_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SFT = os.path.join(ROOT, "configs", "sft.yaml")
TINY = [
    "model.source=tiny",
    "model.tokenizer=char",
    "model.tiny.num_layers=1",
    "logging.tensorboard=false",
    "logging.plots=false",
    "data.eval=null",
    "checkpoint.export_hf=false",
    "checkpoint.save_every=2",
    "checkpoint.keep=3",
]


def _train(capsys, out, *args) -> tuple[int, str]:
    try:
        rc = main(["train", SFT, f"output_dir={out}", *TINY, *args])
    except SystemExit as e:
        rc = e.code
    _, err = capsys.readouterr()
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


@pytest.mark.parametrize(
    "address, want",
    [("10.0.0.2:8476", ("10.0.0.2", 8476)), ("[::1]:99", ("::1", 99)), ("h:1", ("h", 1))],
)
def test_coordinator_address(address, want):
    assert coordinator_host_port(address) == want


@pytest.mark.parametrize("address", ["localhost:notaport", "localhost", ":80", "h:0", "h:70000"])
def test_coordinator_address_refused(address):
    with pytest.raises(ConfigError, match="HOST:PORT"):
        coordinator_host_port(address)


def test_first_difference_names_the_first_key_in_order():
    a = {"max_steps": "2", "optim.lr": "0.01", "rollout.prompts_per_step": "8"}
    assert first_difference(a, dict(a)) is None
    assert first_difference(a, {**a, "rollout.prompts_per_step": "16"}) == (
        "rollout.prompts_per_step"
    )
    assert first_difference(a, {**a, "optim.lr": "0.1", "max_steps": "3"}) == "max_steps"
    assert first_difference(a, {k: v for k, v in a.items() if k != "optim.lr"}) == "optim.lr"


def test_flat_config_leaves_out_output_dir_only(tmp_path):
    from jaxrl_llm.train.config.config_io import load_config
    from jaxrl_llm.train.config.run_config import RunConfig

    cfg = load_config(RunConfig, SFT, [*TINY, f"output_dir={tmp_path}"])
    flat = flat_config(cfg)
    assert "output_dir" not in flat
    assert flat["max_steps"] == "30" and flat["distributed.failure_timeout_s"] == "60.0"
    other = load_config(RunConfig, SFT, [*TINY, "output_dir=elsewhere"])
    assert flat_config(other) == flat


def _pair(timeout_s: float):
    """Two watches (process 0 and 1) on localhost, their exits recorded instead of taken."""
    ports: queue.Queue = queue.Queue()
    exits: dict[int, list[int]] = {0: [], 1: []}

    def exchange(port):
        if port is not None:
            ports.put(port)
            return port
        return ports.get(timeout=10)

    made: dict[int, PeerWatch] = {}

    def make(pid):
        made[pid] = PeerWatch(
            pid,
            2,
            "127.0.0.1",
            timeout_s,
            exchange,
            exit=exits[pid].append,
            checkpoints=lambda: "the last complete checkpoint is step 7 in /x",
        )

    threads = [threading.Thread(target=make, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    return made, exits


def _wait_for(cond, seconds: float = 10.0) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_peer_watch_sees_a_process_leave_and_names_it(capfd):
    made, exits = _pair(timeout_s=5.0)
    made[1].leave()  # process 1 goes without a word (its sockets close, as on SIGKILL)
    assert _wait_for(lambda: exits[0] == [LOST_EXIT_STATUS])
    err = capfd.readouterr().err
    assert "process 0: lost process 1 of the job (it exited or was killed)" in err, err
    assert "The last complete checkpoint is step 7 in /x" in err and exits[1] == []
    made[0].close()


def test_peer_watch_sees_a_silent_process_after_its_timeout(capfd):
    made, exits = _pair(timeout_s=0.6)
    made[1]._finished.set()  # process 1 hangs: its heartbeats stop, its socket stays open
    assert _wait_for(lambda: exits[0] == [LOST_EXIT_STATUS])
    assert "no heartbeat for 0.6 s" in capfd.readouterr().err
    made[0].close()
    made[1]._close()


def test_peer_watch_lets_a_finished_process_go(capfd):
    made, exits = _pair(timeout_s=0.6)
    made[1].close()  # process 1's run ended: "done", then its sockets close
    assert not _wait_for(lambda: exits[0], seconds=2.0)
    made[0].close()
    assert "lost process" not in capfd.readouterr().err
