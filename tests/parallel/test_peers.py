"""``parallel/peers.py``: two watches on localhost sockets, their exits recorded instead of taken.
A job's lost process end to end: ``tests/train/test_multihost_faults.py``."""

import queue
import socket
import struct
import threading
import time

import pytest

from jaxrl_llm.parallel.peers import LOST_EXIT_STATUS, PeerWatch
from tests.train.harness import free_port


def _pair(timeout_s: float, *, before_1=None, port: int = 0, handshake_s: float = 5.0):
    """Two watches (process 0 and 1) on localhost, their exits recorded instead of taken;
    ``before_1(port)`` runs once process 0 listens, before process 1 joins."""
    published: queue.Queue = queue.Queue()
    exits: dict[int, list[int]] = {0: [], 1: []}

    def exchange(value):
        if value is not None:
            published.put(value)
            return value
        value = published.get(timeout=10)
        if before_1 is not None:
            before_1(int(value.split()[0]))
        return value

    made: dict[int, PeerWatch] = {}

    def make(pid):
        made[pid] = PeerWatch(
            pid,
            2,
            "127.0.0.1",
            timeout_s,
            exchange,
            exit=exits[pid].append,
            port=port,
            handshake_s=handshake_s,
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
    made[0].leave(settle_s=5.0)  # process 0's run raised (5 s: a loaded CI host is slow)
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


def _listening_address(port: int) -> str:
    """The local address a listening TCP socket on ``port`` is bound to (``/proc/net/tcp``)."""
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if int(p, 16) == port and state == "0A":  # LISTEN
            return socket.inet_ntoa(struct.pack("<I", int(addr, 16)))
    raise AssertionError(f"nothing listens on port {port}")


def _outsiders(port: int, seen: dict) -> list[socket.socket]:
    """Three connections from outside the job to process 0's watch: junk, a forged record (a
    process id, a nonce and a made-up MAC, then a "lost process 1" record), and a silent one.
    ``seen`` records where the port is bound while they connect."""
    seen["address"] = _listening_address(port)
    junk, forged, silent = (socket.create_connection(("127.0.0.1", port)) for _ in range(3))
    junk.sendall(b"\x00GET / HTTP/1.1\r\n\r\n" * 20)
    forged.sendall(struct.pack("!i", 1) + b"n" * 16 + b"m" * 32 + b"L" + struct.pack("!i", 1))
    seen["forged_answer"] = forged.recv(4096)
    return [junk, forged, silent]


def _closed_by_process_0(conn: socket.socket, seconds: float = 2.0) -> bool:
    """Whether ``conn``'s stream ends (after the challenge) within ``seconds``."""
    conn.settimeout(seconds)
    try:
        while conn.recv(4096):
            pass
    except ConnectionResetError:  # closed with the outsider's bytes unread
        pass
    except TimeoutError:
        return False
    return True


def test_outsiders_during_start_up_leave_the_watch_untouched(capfd):
    """Junk, a forged answer and a silent connection reach process 0 before process 1 does:
    each is dropped (the silent one after the handshake time), process 1 still joins, nobody
    is reported lost, and the port was bound on 127.0.0.1, not on every interface."""
    seen: dict = {}
    held: list[socket.socket] = []
    made, exits = _pair(
        timeout_s=1.0,
        handshake_s=1.0,
        before_1=lambda port: held.extend(_outsiders(port, seen)),
    )
    try:
        assert seen["address"] == "127.0.0.1", seen
        assert seen["forged_answer"].startswith(b"jaxrl-llm peer watch")  # the challenge only
        assert sorted(made) == [0, 1] and made[0]._socks.keys() == {1}
        time.sleep(2.5)  # beyond the handshake time and the heartbeat timeout
        assert exits == {0: [], 1: []}
        assert all(_closed_by_process_0(conn) for conn in held)
    finally:
        for conn in held:
            conn.close()
        made[1].close()
        made[0].close()
    err = capfd.readouterr().err
    assert "lost process" not in err, err


def test_the_port_is_closed_after_start_up_and_junk_from_a_peer_is_ignored(capfd):
    port = free_port()
    made, exits = _pair(timeout_s=1.0, port=port)
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2.0)
        # records the protocol does not know, and a "lost" record naming no process of the job
        made[1]._send(0, b"xyz" + b"L" + struct.pack("!i", 7) + b"L" + struct.pack("!i", 0))
        made[0]._send(1, b"\x00\xff" + b"L" + struct.pack("!i", 1))  # names process 1 itself
        time.sleep(2.0)
        assert exits == {0: [], 1: []}
    finally:
        made[1].close()
        made[0].close()
    assert "lost process" not in capfd.readouterr().err


def test_a_wrong_secret_is_refused_before_any_record():
    """A process that holds another job's secret is refused by process 0's challenge."""
    published: queue.Queue = queue.Queue()
    done: dict = {}

    def exchange(value):
        if value is not None:
            published.put(value)
            return value
        port, _ = published.get(timeout=10).split()
        return f"{port} {'00' * 32}"

    def make(pid):
        try:
            done[pid] = PeerWatch(
                pid, 2, "127.0.0.1", 1.0, exchange, exit=lambda s: None, join_s=4.0
            )
        except OSError as e:
            done[pid] = e

    threads = [threading.Thread(target=make, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    threads[1].join(timeout=20)
    assert isinstance(done[1], ConnectionError), done
    threads[0].join(timeout=20)  # process 0 waits join_s for a process 1 that proves itself
    assert isinstance(done[0], TimeoutError) and "[1] did not join the watch within 4 s" in str(
        done[0]
    )
