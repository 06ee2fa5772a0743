"""``parallel/peers.py``: two watches on localhost sockets, their exits recorded instead of taken.
A job's lost process end to end: ``tests/train/test_multihost_faults.py``."""

import queue
import threading
import time

from jaxrl_llm.parallel.peers import LOST_EXIT_STATUS, PeerWatch


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


def test_an_error_after_a_peer_died_reports_the_lost_peer(capfd):
    """Process 1 dies; process 0's own run then fails (its collective with process 1 broke)
    and its error path leaves the watch: the watch names the lost process and exits, rather
    than leaving quietly (which let JAX's shutdown barrier wait for the dead process and
    abort natively)."""
    made, exits = _pair(timeout_s=30.0)
    made[1]._close()  # process 1 is SIGKILLed: its sockets close without a word
    made[0].leave()  # process 0's run raised: its error path leaves the watch
    assert exits[0] == [LOST_EXIT_STATUS]
    assert (
        "process 0: lost process 1 of the job (it exited or was killed)" in capfd.readouterr().err
    )


def test_an_error_of_its_own_leaves_quietly(capfd):
    made, exits = _pair(timeout_s=30.0)
    t = time.monotonic()
    made[0].leave(settle_s=0.5)  # no peer ended: a fault of this process
    assert time.monotonic() - t < 2.0 and exits[0] == []
    assert _wait_for(lambda: exits[1] == [LOST_EXIT_STATUS])  # process 1 sees it leave
    made[1].close()
    assert "process 1: lost process 0" in capfd.readouterr().err
