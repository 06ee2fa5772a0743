"""A watch on the other processes of a job: a lost process stops the others in one line.

When one process of a multi-controller job dies (SIGKILL, out of memory, its host gone), the
others wait for it in their next collective. JAX's coordination service notices the missing
heartbeats only after its heartbeat timeout and then aborts every process natively (``F...
client.h: Terminating process because the JAX distributed service detected fatal errors`` and
a C++ stack trace); a wait in a key-value exchange lasts its own timeout.

:class:`PeerWatch` is a side channel of plain TCP sockets, a star around process 0: every other
process holds one connection to process 0 and both ends send a heartbeat byte every few
seconds. A process that ends closes its sockets (the kernel does, even on SIGKILL), so its
loss is seen at once; a host that goes silent is seen after ``failure_timeout_s`` without a
heartbeat. The process that sees it prints one line naming the lost process and the last
complete checkpoint, tells the others (process 0 relays it) and exits with
:data:`LOST_EXIT_STATUS`, without waiting in any collective. JAX's own heartbeat timeout is set
``failure_timeout_s + 30`` s (:func:`~jaxrl_llm.parallel.initialize_distributed`) as the
backstop.

A process whose run ended normally calls :meth:`PeerWatch.finish` first: its sockets closing
is then no loss.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Callable

#: Exit status of a process that stopped because another process of its job was lost.
LOST_EXIT_STATUS = 1

_HEARTBEAT, _DONE, _LOST = b"h", b"d", b"L"

#: Seconds a process that sees a peer's connection close waits before it reports the loss: a
#: job whose processes all stop on the same error closes them together, and each says so.
_LEAVE_GRACE_S = 3.0


def _interval(timeout_s: float) -> float:
    """Seconds between heartbeats: a quarter of the timeout, at most 5 s."""
    return max(0.05, min(5.0, timeout_s / 4))


class PeerWatch:
    """The watch of one process on the others (module docstring).

    Args:
      process_id, num_processes: this process and the job's size.
      host: process 0's host (the coordinator's).
      timeout_s: seconds without a heartbeat before a peer counts as lost.
      exchange_port: ``exchange_port(port_or_None) -> port``: process 0's listening port, made
        known to every process (a broadcast over the job); process 0 passes its port.
      checkpoints: returns the words that name the last complete checkpoint (for the line).
      exit: how the process ends (``os._exit``; a test may replace it).
    """

    def __init__(
        self,
        process_id: int,
        num_processes: int,
        host: str,
        timeout_s: float,
        exchange_port: Callable[[int | None], int],
        *,
        checkpoints: Callable[[], str] = lambda: "no checkpoint is known",
        exit: Callable[[int], object] = os._exit,
    ):
        self.pid, self.n, self.timeout = process_id, num_processes, float(timeout_s)
        self.checkpoints = checkpoints
        self._exit = exit
        self._finished = threading.Event()
        self._ended = threading.Event()  # a peer's connection reached its end
        self._reported = threading.Event()  # this process said which process was lost
        self._lock = threading.Lock()
        self._socks: dict[int, socket.socket] = {}
        self._done: set[int] = set()
        if process_id == 0:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.bind(("0.0.0.0", 0))
            server.listen(num_processes)
            exchange_port(server.getsockname()[1])
            server.settimeout(max(self.timeout, 30.0))
            try:
                for _ in range(num_processes - 1):
                    conn, _ = server.accept()
                    (peer,) = struct.unpack("!i", _recv_exact(conn, 4))
                    self._socks[peer] = conn
            finally:
                server.close()
        else:
            port = exchange_port(None)
            conn = socket.create_connection((host, port), timeout=max(self.timeout, 30.0))
            conn.sendall(struct.pack("!i", process_id))
            self._socks[0] = conn
        for peer, conn in self._socks.items():
            conn.settimeout(self.timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(
                target=self._listen, args=(peer, conn), name=f"jaxrl-llm-peer-{peer}", daemon=True
            ).start()
        threading.Thread(target=self._beat, name="jaxrl-llm-heartbeat", daemon=True).start()

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
            except TimeoutError:
                return self._lost(peer, f"no heartbeat for {self.timeout:g} s")
            except ConnectionError:  # reset: it ended with bytes unread, as at end of stream
                byte = b""
            except OSError as e:
                return self._lost(peer, e.strerror or str(e))
            if byte == _HEARTBEAT:
                continue
            if byte == _DONE:
                self._done.add(peer)
                return
            if byte == _LOST:  # process 0 relays another process's loss
                lost = struct.unpack("!i", _recv_exact(conn, 4))[0]
                return self._lost(lost, "seen by process 0")
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


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed its connection during the handshake")
        data += chunk
    return data
