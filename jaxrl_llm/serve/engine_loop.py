"""The one thread that runs device work for a server, batching what arrives together.

Every protocol's routes hand device work (a tenant's ``forward_backward``, a sampling request,
an ``optim_step``) to one :class:`EngineLoop`. Its thread takes everything queued at that
moment, groups the items by ``kind`` in arrival order, and calls each kind's handler once with
the whole group: the handler may run several requests (several tenants' batches, several
prompts) as one jitted program. Programs therefore run one at a time, in a fixed order, on the
thread that owns the accelerator, while the HTTP side stays responsive (the vLLM / SGLang
split of an API server from its engine loop; the Tinker service's per-step batching of
concurrent clients' work, https://tinker-docs.thinkingmachines.ai/).

Order: items of one kind reach their handler in arrival order; kinds run in the order of their
first item in the drained queue, so an item of one kind may run before an earlier item of
another. Work that must stay ordered (a tenant's ``forward_backward`` before its
``optim_step``) is one kind whose handler keeps the order (the Tinker protocol does this).

A handler returns one result per item, or raises: an exception raised by the handler fails
every item of its group, while a :class:`BaseException` instance *returned* in an item's
place fails only that item (one bad request never costs the others theirs).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

#: ``handler(items) -> results``: one result (or a returned exception) per item, in order.
Handler = Callable[[list[Any]], Sequence[Any]]


@dataclasses.dataclass
class _Work:
    kind: str
    item: Any
    future: concurrent.futures.Future


class EngineLoop:
    """A queue of device work drained by one thread, in groups of the same kind.

    Args:
      handlers: ``kind -> handler``; more can be added with :meth:`register` before
        :meth:`start`.
      max_group: the most items of one kind handed to a handler at once (None: all queued).

    Example:
      >>> loop = EngineLoop({"double": lambda xs: [2 * x for x in xs]})
      >>> loop.start()
      >>> loop.submit("double", 21).result()
      42
      >>> loop.stop()
    """

    def __init__(self, handlers: dict[str, Handler] | None = None, *, max_group: int | None = None):
        self._handlers: dict[str, Handler] = dict(handlers or {})
        self._max_group = max_group
        self._queue: collections.deque[_Work] = collections.deque()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: groups handed to handlers, per kind (a test reads how requests were batched)
        self.groups: collections.Counter = collections.Counter()

    def register(self, kind: str, handler: Handler) -> None:
        """Add the handler of ``kind`` (a protocol's device work)."""
        if kind in self._handlers:
            raise ValueError(f"engine loop: kind {kind!r} already has a handler")
        self._handlers[kind] = handler

    def start(self) -> EngineLoop:
        """Start the thread (idempotent); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
            self._thread.start()
        return self

    def submit(self, kind: str, item: Any) -> concurrent.futures.Future:
        """Queue one item of ``kind``; its future resolves to the handler's result for it."""
        if kind not in self._handlers:
            raise KeyError(f"engine loop: no handler for {kind!r}")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._wake:
            if self._stopping:
                raise RuntimeError("engine loop: stopped")
            self._queue.append(_Work(kind, item, future))
            self._wake.notify()
        return future

    async def run(self, kind: str, item: Any) -> Any:
        """:meth:`submit` awaited from an ``asyncio`` route."""
        return await asyncio.wrap_future(self.submit(kind, item))

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn()`` on the loop's thread, in queue order (one-off device work such as
        loading a tenant's checkpoint); returns its future."""
        return self.submit("__call__", fn)

    def stop(self, timeout: float | None = 60.0) -> None:
        """Finish what is queued, then end the thread."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # ----- the thread -------------------------------------------------------------------------

    def _take(self) -> list[_Work] | None:
        """Everything queued now (None when stopped and empty); blocks while nothing is."""
        with self._wake:
            while not self._queue and not self._stopping:
                self._wake.wait()
            if not self._queue:
                return None
            work = list(self._queue)
            self._queue.clear()
            return work

    def _run(self) -> None:
        self._handlers.setdefault("__call__", lambda fns: [_called(fn) for fn in fns])
        while (work := self._take()) is not None:
            by_kind: dict[str, list[_Work]] = {}
            for w in work:
                by_kind.setdefault(w.kind, []).append(w)
            for kind, group in by_kind.items():
                step = self._max_group or len(group)
                for i in range(0, len(group), step):
                    self._handle(kind, group[i : i + step])

    def _handle(self, kind: str, group: list[_Work]) -> None:
        live = [w for w in group if w.future.set_running_or_notify_cancel()]
        if not live:
            return
        self.groups[kind] += 1
        try:
            results = list(self._handlers[kind]([w.item for w in live]))
            if len(results) != len(live):
                raise RuntimeError(
                    f"engine loop: handler of {kind!r} returned {len(results)} results "
                    f"for {len(live)} items"
                )
        except BaseException as e:  # a handler's failure fails its group, never the loop
            if not isinstance(e, Exception):
                traceback.print_exc()
            for w in live:
                w.future.set_exception(e)
            return
        for w, r in zip(live, results):
            if isinstance(r, BaseException):
                w.future.set_exception(r)
            else:
                w.future.set_result(r)


def _called(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # returned: fails this call only
        return e
