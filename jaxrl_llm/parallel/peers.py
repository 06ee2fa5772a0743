"""A watch on the other processes of a job: a lost process stops the others in one line.

When one process of a multi-controller job dies (SIGKILL, out of memory, its host gone), the
others wait for it in their next collective. JAX's coordination service notices the missing
heartbeats only after its heartbeat timeout and then aborts every process natively (``F...
client.h: Terminating process because the JAX distributed service detected fatal errors`` and
a C++ stack trace); a wait in a key-value exchange lasts its own timeout. JAX's runtime does
give the rest: its heartbeats stay the backstop (set ``failure_timeout_s + 30`` s by
:func:`~jaxrl_llm.parallel.initialize_distributed`), its preemption sync point stops every
process at one step on a SIGTERM (:func:`~jaxrl_llm.parallel.distributed.preemption_notice`),
and its key-value store carries this watch's address and secret.

What this side channel adds: a process that ends is seen *at once* (the kernel closes its
sockets, even on SIGKILL), not after a heartbeat timeout; the process that sees it prints one
line naming the lost process and the last complete checkpoint, and every process exits with
:data:`LOST_EXIT_STATUS` instead of aborting natively. A host that goes silent is seen after
``failure_timeout_s`` without a heartbeat byte.

:class:`PeerWatch` is a star of plain TCP sockets around process 0: every other process holds
one connection to process 0 and both ends send a heartbeat byte every few seconds; process 0
relays a loss it sees to the others. It is closed to outsiders:

- process 0 listens only on the address its processes reach it at (the coordinator's host:
  ``127.0.0.1`` for a local job), never on every interface, and only during start-up;
- a per-job secret (32 random bytes) goes from process 0 to the others through JAX's
  coordination service (the key-value store every process of the job already trusts); a
  connection is admitted only when it answers a fresh nonce with its HMAC-SHA256 under that
  secret (RFC 2104), and process 0 proves the same back, before any record is read;
- a connection that has not completed that handshake within :data:`HANDSHAKE_S` is closed,
  and so is one whose answer is wrong: neither holds or stops the job;
- a record the protocol does not know (a byte other than heartbeat, done, lost; a lost record
  naming no process of the job) is ignored.

A process whose run ended normally calls :meth:`PeerWatch.finish` first: its sockets closing
is then no loss.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import queue
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Exit status of a process that stopped because another process of its job was lost.
LOST_EXIT_STATUS = 1

#: Seconds a connection to process 0 has to complete the handshake before it is dropped.
HANDSHAKE_S = 5.0

_HEARTBEAT, _DONE, _LOST = b"h", b"d", b"L"
_MAGIC = b"jaxrl-llm peer watch 1\n"
_NONCE = 16

#: Seconds a process that sees a peer's connection close waits before it reports the loss: a
#: job whose processes all stop on the same error closes them together, and each says so.
_LEAVE_GRACE_S = 3.0


def _interval(timeout_s: float) -> float:
    """Seconds between heartbeats: a quarter of the timeout, at most 5 s."""
    return max(0.05, min(5.0, timeout_s / 4))


def _mac(secret: bytes, role: bytes, nonce: bytes, pid: int) -> bytes:
    """HMAC-SHA256 of ``role + nonce + pid`` under the job's secret (RFC 2104)."""
    return hmac.new(secret, role + nonce + struct.pack("!i", pid), hashlib.sha256).digest()


def bind_address(host: str) -> tuple[socket.AddressFamily, str]:
    """The address family and address process 0 listens on: ``host`` (the coordinator's, as
    its processes reach it) resolved on this machine; never the wildcard address.

    Raises:
      OSError: ``host`` does not resolve here.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0]
    return family, str(sockaddr[0])


class PeerWatch:
    """The watch of one process on the others (module docstring).

    Args:
      process_id, num_processes: this process and the job's size.
      host: process 0's host (the coordinator's); process 0 listens on it alone.
      timeout_s: seconds without a heartbeat before a peer counts as lost.
      exchange: ``exchange(value_or_None) -> value``: process 0 passes ``"PORT SECRET_HEX"``,
        the others pass None and get it (JAX's key-value store; a test may use a queue).
      port: the port process 0 listens on (0: one the system picks).
      checkpoints: returns the words that name the last complete checkpoint (for the line).
      exit: how the process ends (``os._exit``; a test may replace it).
      handshake_s: seconds a connection has to prove it belongs to the job.
      join_s: seconds process 0 waits for every other process to join (default
        ``max(timeout_s, 30)``).

    Raises:
      OSError: the watch could not start (a peer never joined, a wrong answer to process 0).
    """

    def __init__(
        self,
        process_id: int,
        num_processes: int,
        host: str,
        timeout_s: float,
        exchange: Callable[[str | None], str],
        *,
        port: int = 0,
        checkpoints: Callable[[], str] = lambda: "no checkpoint is known",
        exit: Callable[[int], object] = os._exit,
        handshake_s: float = HANDSHAKE_S,
        join_s: float | None = None,
    ):
        self.pid, self.n, self.timeout = process_id, num_processes, float(timeout_s)
        self.checkpoints = checkpoints
        self._exit = exit
        self._handshake_s = float(handshake_s)
        self._join_s = max(self.timeout, 30.0) if join_s is None else float(join_s)
        self._finished = threading.Event()
        self._ended = threading.Event()  # a peer's connection reached its end
        self._reported = threading.Event()  # this process said which process was lost
        self._lock = threading.Lock()
        self._socks: dict[int, socket.socket] = {}
        self._done: set[int] = set()
        if process_id == 0:
            self._admit(host, port, exchange)
        else:
            self._join(host, exchange)
        for peer, conn in self._socks.items():
            conn.settimeout(self.timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._listen, args=(peer, conn), name=f"jaxrl-llm-peer-{peer}", daemon=True
            ).start()
        threading.Thread(target=self._beat, name="jaxrl-llm-heartbeat", daemon=True).start()

    # ----- start-up ------------------------------------------------------------------------
    def _admit(self, host: str, port: int, exchange: Callable[[str | None], str]) -> None:
        """Process 0: listen on the coordinator's address until every other process of the job
        has proved it belongs to it; then stop listening."""
        secret = secrets.token_bytes(32)
        family, address = bind_address(host)
        server = socket.socket(family, socket.SOCK_STREAM)
        admitted: queue.Queue[tuple[int, socket.socket]] = queue.Queue()
        started = threading.Event()  # set once start-up is over: late handshakes close
        acceptor = None
        try:
            server.bind((address, port))
            server.listen(max(8, self.n))
            server.settimeout(0.2)
            exchange(f"{server.getsockname()[1]} {secret.hex()}")
            acceptor = threading.Thread(
                target=self._accept,
                args=(server, secret, admitted, started),
                name="jaxrl-llm-peer-accept",
                daemon=True,
            )
            acceptor.start()
            deadline = time.monotonic() + self._join_s
            while len(self._socks) < self.n - 1:
                try:
                    peer, conn = admitted.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    missing = sorted(set(range(1, self.n)) - set(self._socks))
                    raise TimeoutError(
                        f"process(es) {missing} did not join the watch within {self._join_s:g} s"
                    ) from None
                if peer in self._socks:
                    conn.close()  # a second connection of one process: keep the first
                else:
                    self._socks[peer] = conn
        finally:
            started.set()
            if acceptor is not None:
                acceptor.join()  # within its accept timeout: then nothing listens
            server.close()
            while not admitted.empty():
                admitted.get()[1].close()

    def _accept(self, server, secret, admitted, started) -> None:
        """Process 0's acceptor thread: each connection's handshake runs on a thread of its
        own, so a silent connection holds up nobody."""
        while not started.is_set():
            try:
                conn, addr = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listening socket closed
            threading.Thread(
                target=self._greet,
                args=(conn, addr, secret, admitted, started),
                name="jaxrl-llm-peer-handshake",
                daemon=True,
            ).start()

    def _greet(self, conn, addr, secret, admitted, started) -> None:
        """Process 0's side of one handshake: a nonce out, the peer's id, nonce and MAC in,
        process 0's MAC over the peer's nonce out. A wrong, late or malformed answer closes
        the connection."""
        try:
            conn.settimeout(self._handshake_s)
            deadline = time.monotonic() + self._handshake_s
            nonce = secrets.token_bytes(_NONCE)
            conn.sendall(_MAGIC + nonce)
            answer = _recv_exact(conn, 4 + _NONCE + 32, deadline)
            (peer,) = struct.unpack("!i", answer[:4])
            theirs, mac = answer[4 : 4 + _NONCE], answer[4 + _NONCE :]
            if not 0 < peer < self.n or not hmac.compare_digest(
                mac, _mac(secret, b"peer", nonce, peer)
            ):
                raise ConnectionError("a wrong answer to the job's challenge")
            conn.sendall(_mac(secret, b"zero", theirs, peer))
        except OSError as e:
            log.warning(
                "peer watch: dropped a connection from %s that did not prove it belongs to this "
                "job (%s)",
                addr[0],
                "no answer within %g s" % self._handshake_s
                if isinstance(e, TimeoutError)
                else e.strerror or e,
            )
            conn.close()
            return
        if started.is_set():
            conn.close()
        else:
            admitted.put((peer, conn))

    def _join(self, host: str, exchange: Callable[[str | None], str]) -> None:
        """Every other process: connect to process 0 and answer its challenge."""
        port, secret_hex = exchange(None).split()
        secret = bytes.fromhex(secret_hex)
        conn = socket.create_connection((host, int(port)), timeout=self._join_s)
        try:
            deadline = time.monotonic() + self._join_s
            hello = _recv_exact(conn, len(_MAGIC) + _NONCE, deadline)
            if not hello.startswith(_MAGIC):
                raise ConnectionError(f"{host}:{port} is not process 0's watch")
            ours = secrets.token_bytes(_NONCE)
            mac = _mac(secret, b"peer", hello[len(_MAGIC) :], self.pid)
            conn.sendall(struct.pack("!i", self.pid) + ours + mac)
            if not hmac.compare_digest(
                _recv_exact(conn, 32, deadline), _mac(secret, b"zero", ours, self.pid)
            ):
                raise ConnectionError(f"{host}:{port} did not prove it is process 0's watch")
        except BaseException:
            conn.close()
            raise
        self._socks[0] = conn

    # ----- the threads ---------------------------------------------------------------------
    def _send(self, peer: int, data: bytes) -> None:
        try:
            with self._lock:
                self._socks[peer].sendall(data)
        except OSError:
            pass  # its listener sees the loss

    def _beat(self) -> None:
        while not self._finished.wait(_interval(self.timeout)):
            for peer in list(self._socks):
                if peer not in self._done:
                    self._send(peer, _HEARTBEAT)

    def _listen(self, peer: int, conn: socket.socket) -> None:
        while True:
            try:
                byte = conn.recv(1)
                if byte == _LOST:
                    record = _recv_exact(conn, 4, time.monotonic() + self.timeout)
            except TimeoutError:
                return self._lost(peer, f"no heartbeat for {self.timeout:g} s")
            except ConnectionError:  # reset: it ended with bytes unread, as at end of stream
                byte = b""
            except OSError as e:
                return self._lost(peer, e.strerror or str(e))
            if byte == _DONE:
                self._done.add(peer)
                return
            if byte == _LOST:  # process 0 relays another process's loss
                (lost,) = struct.unpack("!i", record)
                if peer == 0 and 0 < lost < self.n and lost != self.pid:
                    return self._lost(lost, "seen by process 0")
                continue  # a record that names no other process of the job
            if byte:
                continue  # a heartbeat, or a record this watch does not know
            # end of stream: the peer's process ended. When this one is ending too (every
            # process stopping on the same error), it says so itself within a moment.
            self._ended.set()
            if self._finished.wait(_LEAVE_GRACE_S):
                return
            return self._lost(peer, "it exited or was killed")

    def _lost(self, peer: int, how: str) -> None:
        if self._finished.is_set():
            return  # this process's run ended: peers leaving is expected
        self._finished.set()
        if self.pid == 0:
            for other in self._socks:
                if other != peer:
                    self._send(other, _LOST + struct.pack("!i", peer))
        self._reported.set()
        where = self.checkpoints()
        os.write(
            2,
            (
                f"jaxrl-llm train: error: process {self.pid}: lost process {peer} of the job "
                f"({how}); stopping without waiting for it. {where[:1].upper()}{where[1:]}; "
                f"relaunch every process with --resume auto\n"
            ).encode(),
        )
        self._exit(LOST_EXIT_STATUS)

    # ----- the run's side ------------------------------------------------------------------
    def finish(self) -> None:
        """This process's run ended normally: tell the others, and stop watching them."""
        if self._finished.is_set():
            return
        self._finished.set()
        for peer in list(self._socks):
            self._send(peer, _DONE)

    def leave(self, settle_s: float = 1.0) -> None:
        """This process stops on its own (an error, a signal): stop watching and close the
        sockets without a word, so that the others see it leave now.

        Unless a peer's connection ended within ``settle_s`` of the call: then the error here
        is most likely that loss surfacing (a collective that failed when the peer died), and
        the watch reports it first, naming the lost process, and exits (within
        ``_LEAVE_GRACE_S``). Leaving quietly instead would let this process end through JAX's
        shutdown barrier, which waits for the lost process until the heartbeat timeout and then
        aborts natively."""
        if not self._finished.is_set() and self._ended.wait(settle_s):
            self._reported.wait(_LEAVE_GRACE_S + 1.0)  # the listener reports and exits
        self._finished.set()
        self._close()

    def close(self) -> None:
        """Finish and close the sockets."""
        self.finish()
        self._close()

    def _close(self) -> None:
        for conn in self._socks.values():
            try:  # the end of stream goes out now, even while a listener waits on the socket
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                conn.close()
            except OSError:
                pass


def _recv_exact(conn: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes from ``conn`` by ``deadline`` (``time.monotonic()``): a connection that
    sends a byte now and then cannot stretch the wait. The socket's timeout is restored."""
    data, timeout = b"", conn.gettimeout()
    try:
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            conn.settimeout(left)
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the connection closed during the handshake")
            data += chunk
    finally:
        conn.settimeout(timeout)
    return data
