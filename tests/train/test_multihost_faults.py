"""Faults of a multi-process job (issue 40): each ends in one line and a non-zero exit within a
stated time, with no native abort (``*** Check failure stack trace ***``).

- start-up: a coordinator address without a port, a busy port, an unreachable coordinator,
  two processes given ``--process-id 0`` (``parallel/distributed.py: initialize_distributed``);
- processes whose configs differ, or that do not see one ``output_dir``, stop before step 1
  (``train/run/job.py``);
- a process SIGKILLed mid-run stops the other within ``distributed.failure_timeout_s`` + 30 s,
  naming it and the last complete checkpoint (``parallel/peers.py``), and ``--resume auto``
  continues the run.

2 localhost processes × 4 CPU devices, gloo collectives, as ``test_multihost_runs.py``.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from jaxrl_llm.train.run.checkpoint_steps import complete_steps
from jaxrl_llm.train.run.logging import read_metrics
from tests.train.harness import (
    NATIVE,
    edit_config,
    finish,
    free_port,
    job,
    job_args,
    online_config,
    reference_run,
    sigterm_process_1_after_step_2,
    step_rows,
    train,
    wait,
)

CONNECT_S = 6  # the connect timeout the start-up tests give (--connect-timeout)


def _config(d, *, max_steps: int = 2, **extra) -> str:
    return online_config(d, "grpo", max_steps=max_steps, **extra)


def _train(config: str, *args: str, fault: str | None = None):
    return train(config, *args, devices=4, fault=fault)


def _assert_one_line_error(log: str, *words: str) -> None:
    assert not any(n in log for n in NATIVE), log[-3000:]
    errors = [line for line in log.splitlines() if "error:" in line]
    assert len(errors) == 1, log[-3000:]
    assert all(w in errors[0] for w in words), errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["notaport", "unreachable", "busy_port", "duplicate_id"])
def test_start_up_faults_end_in_one_line(tmp_path, fault):
    config = _config(tmp_path)
    out = f"output_dir={tmp_path / 'run'}"
    port = free_port()
    address = f"127.0.0.1:{port}"
    timeout = ["--connect-timeout", str(CONNECT_S)]
    holder = None
    t0 = time.monotonic()
    if fault == "notaport":
        procs = [_train(config, out, *job_args("localhost:notaport", 0), *timeout)]
        words = [("port in 1..65535",)]
    elif fault == "unreachable":  # nobody is process 0
        procs = [_train(config, out, *job_args(address, 1), *timeout)]
        words = [("coordinator unreachable after 6 s",)]
    elif fault == "busy_port":
        holder = socket.socket()
        holder.bind(("0.0.0.0", port))
        holder.listen(1)
        procs = [_train(config, out, *job_args(address, 0), *timeout)]
        words = [("port", "already in use")]
    else:  # both processes given --process-id 0: the second finds the port taken, the first
        # waits for a process 1 that never comes
        procs = [_train(config, out, *job_args(address, 0), *timeout) for _ in range(2)]
        words = [("did not assemble within 6 s", "--process-id"), ("already in use",)]
    try:
        logs = finish(procs, timeout=240)
    finally:
        if holder is not None:
            holder.close()
    elapsed = time.monotonic() - t0
    for p, log, w in zip(procs, logs, words if fault == "duplicate_id" else words * len(procs)):
        assert p.returncode not in (0, -6, 134, 139), (p.returncode, log[-3000:])
        if fault == "duplicate_id":  # which of the two took the port first is a race
            log_words = [x for x in words if all(s in log for s in x)]
            assert log_words, log[-3000:]
            _assert_one_line_error(log, *log_words[0])
        else:
            _assert_one_line_error(log, *w)
    # start-up (imports) + the stated timeout, well below JAX's own 300 s default
    assert elapsed < 150, elapsed


@pytest.mark.slow
@pytest.mark.parametrize(
    "key, value",
    # a number and a file (the comparison is one over the whole resolved config; each case
    # starts a 2-process job: ~1 min of the suite on a 2-core host)
    [("optim.lr", "0.001"), ("data.train", "OTHER")],
)
def test_processes_with_different_configs_stop_before_step_1(tmp_path, key, value):
    config = _config(tmp_path)
    if value == "OTHER":
        other = tmp_path / "other.jsonl"
        other.write_text((tmp_path / "train.jsonl").read_text().replace(">", "?"))
        value = str(other)
    out = f"output_dir={tmp_path / 'run'}"
    address = f"127.0.0.1:{free_port()}"
    procs = [
        _train(config, out, *job_args(address, 0)),
        _train(config, out, f"{key}={value}", *job_args(address, 1)),
    ]
    logs = finish(procs)
    for p, log in zip(procs, logs):
        assert p.returncode == 2, (p.returncode, log[-3000:])
        _assert_one_line_error(log, "configs differ", key, "process 1")
        assert "step 1" not in log
    assert not os.path.isdir(tmp_path / "run" / "checkpoints")


@pytest.mark.slow
def test_processes_that_do_not_share_output_dir_stop_before_step_1(tmp_path):
    """Process 1 writes to another directory, as a host with its own disk would."""
    config = _config(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    procs = [
        _train(config, f"output_dir={tmp_path / 'host0'}", *job_args(address, 0)),
        _train(config, f"output_dir={tmp_path / 'host1'}", *job_args(address, 1)),
    ]
    logs = finish(procs)
    for p, log in zip(procs, logs):
        assert p.returncode == 2, (p.returncode, log[-3000:])
        _assert_one_line_error(log, "process(es) [1] do not see", "storage every host sees")
        assert "step 1" not in log


@pytest.mark.slow
def test_a_killed_process_stops_the_other_and_resume_auto_continues(tmp_path):
    """Process 1 is SIGKILLed in step 3's update (steps 1 and 2 are checkpointed, step 2's
    write possibly unfinished); process 0 stops within failure_timeout_s + 30 s with one line
    naming process 1 and the last complete checkpoint. The same command with ``--resume auto``
    on both continues from that step and ends at step 4, each step logged once, as the
    uninterrupted run logs it."""
    failure_timeout = 10
    config = _config(tmp_path, max_steps=4, distributed=dict(failure_timeout_s=failure_timeout))
    edit_config(config, checkpoint=dict(save_every=1, keep=3, export_hf=False))
    run = tmp_path / "run"
    out = f"output_dir={run}"
    address = f"127.0.0.1:{free_port()}"
    p0 = _train(config, out, *job_args(address, 0), "--resume", "auto")
    p1 = _train(config, out, *job_args(address, 1), "--resume", "auto", fault="update:3")
    log1 = finish([p1], timeout=600)[0]
    killed_at = time.monotonic()
    assert p1.returncode == -9, log1[-3000:]
    log0 = finish([p0], timeout=failure_timeout + 60)[0]
    waited = time.monotonic() - killed_at
    assert p0.returncode == 1, (p0.returncode, log0[-3000:])
    assert waited < failure_timeout + 30, waited
    # step 2's asynchronous write may still have been in flight on process 1: then step 1
    steps = complete_steps(run / "checkpoints")
    assert steps and steps[-1] in (1, 2), steps
    last = steps[-1]
    _assert_one_line_error(log0, "lost process 1", f"last complete checkpoint is step {last}")
    assert "resume auto: no complete checkpoint" in log0  # the first start said it was fresh

    address = f"127.0.0.1:{free_port()}"
    procs = [_train(config, out, *job_args(address, i), "--resume", "auto") for i in range(2)]
    logs = finish(procs, timeout=600)
    assert [p.returncode for p in procs] == [0, 0], "\n----\n".join(x[-2500:] for x in logs)
    assert f"resumed from step {last} (resume auto" in logs[0], logs[0][-3000:]
    rows = [r for r in read_metrics(str(run)) if r.get("loss") is not None]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    want, got = reference_run(config)[0], step_rows(str(run))  # the uninterrupted run's
    for k, r in want.items():
        assert got[k]["data/prompts_crc32"] == r["data/prompts_crc32"]
        assert got[k]["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), (k, r)
        assert got[k]["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (k, r)


@pytest.mark.slow
def test_a_process_killed_while_a_checkpoint_is_written_leaves_the_previous_one(tmp_path):
    """Process 1 is SIGKILLed while step 2's checkpoint write is in flight
    (``JAXRL_LLM_FAULT=checkpoint:2``): step 2 is never taken as complete, process 0 stops
    within failure_timeout_s + 30 s in one line naming process 1 and step 1, with no native
    abort; ``--resume auto`` on both continues from step 1 and logs what an uninterrupted run
    logs."""
    failure_timeout = 10
    config = _config(tmp_path, max_steps=4, distributed=dict(failure_timeout_s=failure_timeout))
    edit_config(config, checkpoint=dict(save_every=1, keep=3, export_hf=False))
    run = tmp_path / "run"
    out = f"output_dir={run}"
    address = f"127.0.0.1:{free_port()}"
    p0 = _train(config, out, *job_args(address, 0))
    p1 = _train(config, out, *job_args(address, 1), fault="checkpoint:2")
    log1 = finish([p1], timeout=600)[0]
    killed_at = time.monotonic()
    assert p1.returncode == -9, log1[-3000:]
    log0 = finish([p0], timeout=failure_timeout + 60)[0]
    assert p0.returncode != 0, log0[-3000:]
    assert time.monotonic() - killed_at < failure_timeout + 30
    assert not any(n in log0 for n in NATIVE), log0[-3000:]
    assert complete_steps(run / "checkpoints") == [1]
    _assert_one_line_error(log0, "lost process 1", "last complete checkpoint is step 1")

    logs = wait(job(config, str(run), "--resume", "auto"))
    assert "resumed from step 1 (resume auto" in logs[0], logs[0][-3000:]
    want, got = reference_run(config)[0], step_rows(str(run))
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]
    for k, r in want.items():
        assert got[k]["data/prompts_crc32"] == r["data/prompts_crc32"]
        assert got[k]["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), (k, r)
        assert got[k]["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (k, r)


@pytest.mark.slow
def test_sigterm_to_one_process_stops_every_process_at_the_same_step(tmp_path):
    """SIGTERM to process 1 during step 3: both processes stop at the same step boundary, save
    the same step (data position included), print the resume line and exit 143 within 60 s;
    ``--resume auto`` on both logs what an uninterrupted run logs (1 process × 8 devices:
    ``test_multihost_runs.py`` shows that 2 processes log the same)."""
    config = _config(tmp_path, max_steps=4)
    run = tmp_path / "run"
    procs = job(config, str(run))
    logs, sent = sigterm_process_1_after_step_2(procs)
    assert time.monotonic() - sent < 60
    assert [p.returncode for p in procs] == [143, 143], (logs[0][-2500:], logs[1][-2500:])
    steps = complete_steps(run / "checkpoints")
    assert len(steps) == 1 and steps[0] in (2, 3), steps  # the boundary after step 2 or 3
    for log in logs:
        assert not any(n in log for n in NATIVE), log[-3000:]
        assert "(signalled: process 1; all stop here)" in log, log[-3000:]
        assert f"saved step {steps[0]}" in log, log[-3000:]
        assert "--num-processes 2 --process-id" in log and "--resume auto" in log

    logs = wait(job(config, str(run), "--resume", "auto"))
    assert f"resumed from step {steps[0]}" in logs[0]
    want, got = reference_run(config)[0], step_rows(str(run))
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]
    for k, r in want.items():
        assert got[k]["data/prompts_crc32"] == r["data/prompts_crc32"]
        assert got[k]["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), (k, r)
        assert got[k]["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (k, r)


@pytest.mark.slow
def test_sigterm_to_one_process_of_an_async_run_stops_both_at_one_step(tmp_path):
    """The async producer (``rollout.max_staleness: 1``, a thread sampling the next step while
    the learner updates): SIGTERM to process 1 after step 2 stops both processes at the same
    step boundary, both save that one step and exit 143 within 60 s, with no native abort."""
    config = _config(tmp_path, max_steps=5)
    run = tmp_path / "run"
    procs = job(config, str(run), "rollout.max_staleness=1")
    logs, sent = sigterm_process_1_after_step_2(procs)
    assert time.monotonic() - sent < 60
    assert [p.returncode for p in procs] == [143, 143], (logs[0][-2500:], logs[1][-2500:])
    steps = complete_steps(run / "checkpoints")
    assert len(steps) == 1 and steps[0] in (2, 3, 4), steps
    for log in logs:
        assert not any(n in log for n in NATIVE), log[-3000:]
        assert "(signalled: process 1; all stop here)" in log, log[-3000:]
        assert f"saved step {steps[0]}" in log, log[-3000:]
    assert f"step {steps[0] + 1}/" not in logs[0], logs[0][-3000:]  # no step after the boundary


@pytest.mark.slow
def test_sigterm_during_start_up_stops_every_process_before_step_1(tmp_path):
    """SIGTERM to process 1 as its trainer starts (before the model loads and the programs
    compile): the stop is held until both processes agree on it before step 1, and both exit
    143 with the same line (no step finished, nothing saved), no native abort, nobody left in
    a collective."""
    config = _config(tmp_path)
    run = tmp_path / "run"
    out = f"output_dir={run}"
    address = f"127.0.0.1:{free_port()}"
    procs = [
        _train(config, out, *job_args(address, 0)),
        _train(config, out, *job_args(address, 1), fault="start:0:TERM"),
    ]
    logs = finish(procs, timeout=300)
    assert [p.returncode for p in procs] == [143, 143], (logs[0][-2500:], logs[1][-2500:])
    said = (
        "jaxrl-llm train: stopped by SIGTERM: during start-up, before step 1 (signalled: "
        "process 1; all stop here): no step finished, nothing to save"
    )
    for log in logs:
        assert not any(n in log for n in NATIVE), log[-3000:]
        assert said in log.splitlines(), log[-3000:]
        assert "step 1/" not in log and "Traceback" not in log, log[-3000:]
    assert complete_steps(run / "checkpoints") == []


@pytest.mark.slow
def test_a_sigterm_that_jax_takes_before_the_run_stops_every_process(tmp_path):
    """SIGTERM to process 1 after the job's checks and before its run installs its own
    handler: JAX's handler (``jax.distributed.initialize``'s preemption notifier) takes it and
    the process goes on, as it did unnoticed before. The run loop asks JAX's preemption sync
    point at every step boundary beside its own flag: both processes stop at the same boundary,
    with the same line naming the notice, and exit 143."""
    config = _config(tmp_path, max_steps=4)
    run = tmp_path / "run"
    out = f"output_dir={run}"
    address = f"127.0.0.1:{free_port()}"
    procs = [
        _train(config, out, *job_args(address, 0)),
        _train(config, out, *job_args(address, 1), fault="job:0:TERM"),
    ]
    logs = finish(procs, timeout=300)
    assert [p.returncode for p in procs] == [143, 143], (logs[0][-2500:], logs[1][-2500:])
    stops = [
        [x for x in log.splitlines() if x.startswith("jaxrl-llm train: stopped by SIGTERM")]
        for log in logs
    ]
    assert len(stops[0]) == 1 and stops[0] == stops[1], stops
    assert "(signalled: JAX's preemption notice; all stop here)" in stops[0][0], stops
    for log in logs:
        assert not any(n in log for n in NATIVE), log[-3000:]
    assert "step 4/" not in logs[0], logs[0][-3000:]  # it stopped, not ran to the end
