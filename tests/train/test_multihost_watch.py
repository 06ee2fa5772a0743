"""The peer watch is closed to outsiders (issue 53, item 1), end to end: a 2-process job
(4 CPU devices each, gloo on localhost) whose watch port is probed from outside during
start-up and after trains to the end with an undisturbed run's metrics. The watch's own
protocol: ``tests/parallel/test_peers.py``."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from jaxrl_llm.parallel.peers import HANDSHAKE_S
from tests.parallel.test_peers import _closed_by_process_0, _outsiders
from tests.train.harness import (
    free_port,
    job_args,
    online_config,
    reference_run,
    step_rows,
    train,
    wait,
)


def _probe(port: int, procs, seen: dict) -> None:
    """Connect to the watch's port as soon as process 0 listens (process 1 is held 4 s before
    it joins): junk, a forged answer, a silent connection; then, until the job ends, junk
    every half second (refused once start-up is over)."""
    held: list[socket.socket] = []
    try:
        while all(p.poll() is None for p in procs):
            try:
                held.extend(_outsiders(port, seen))
                break
            except (ConnectionRefusedError, AssertionError):  # not listening yet
                time.sleep(0.05)
        seen["dropped"] = [_closed_by_process_0(c, HANDSHAKE_S + 2) for c in held]
        seen["after"] = []
        while all(p.poll() is None for p in procs):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2.0) as c:
                    c.sendall(b"L\x00\x00\x00\x01" * 4)
                    seen["after"].append("connected")
            except ConnectionRefusedError:
                seen["after"].append("refused")
            time.sleep(0.5)
    finally:
        for c in held:
            c.close()


@pytest.mark.slow
def test_outsiders_on_the_watch_port_leave_the_job_untouched(tmp_path, monkeypatch):
    config = online_config(tmp_path, "grpo", max_steps=3)
    port = free_port()
    monkeypatch.setenv("JAXRL_LLM_WATCH_PORT", str(port))
    run = tmp_path / "run"
    address = f"127.0.0.1:{free_port()}"
    procs = [
        train(config, f"output_dir={run}", *job_args(address, 0), devices=4),
        train(config, f"output_dir={run}", *job_args(address, 1), devices=4, fault="job:0:HOLD=4"),
    ]
    seen: dict = {}
    prober = threading.Thread(target=_probe, args=(port, procs, seen), daemon=True)
    prober.start()
    logs = wait(procs)
    prober.join(timeout=10)
    assert seen.get("address") == "127.0.0.1", seen  # not 0.0.0.0: the coordinator's address
    assert seen["forged_answer"].startswith(b"jaxrl-llm peer watch"), seen
    assert seen["dropped"] == [True, True, True], seen
    assert seen["after"] and set(seen["after"]) == {"refused"}, seen
    assert "dropped a connection from 127.0.0.1" in logs[0], logs[0][-3000:]
    assert "lost process" not in logs[0] + logs[1]
    want, got = reference_run(config)[0], step_rows(str(run))
    assert sorted(got) == sorted(want) == [1, 2, 3]
    for k, r in want.items():
        assert got[k]["data/prompts_crc32"] == r["data/prompts_crc32"]
        assert got[k]["reward/mean"] == pytest.approx(r["reward/mean"], abs=1e-6), (k, r)
        assert got[k]["loss"] == pytest.approx(r["loss"], rel=1e-4, abs=1e-6), (k, r)
