"""Lines for the long phases of a run: a line when a phase starts and one when it ends, with
its time (``model load: started`` ... ``model load: done in 41.2 s``), so that minutes of
loading, converting or evaluating are not minutes of silence. Main process only.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator


def _main_process() -> bool:
    import jax

    return jax.process_index() == 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def phase(name: str, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Say ``"{name}: started"`` now and ``"{name}: done in {s} s"`` (or ``"{name}: failed
    after {s} s"``, or ``"stopped after"`` on Ctrl-C) when the block ends; ``say`` defaults to
    a line on stderr from the main process.

    Example::

        with phase("model load"):
            params = load(...)
    """
    if say is None:
        say = _stderr if _main_process() else (lambda line: None)
    say(f"{name}: started")
    t0 = time.perf_counter()
    try:
        yield
    except KeyboardInterrupt:
        say(f"{name}: stopped after {time.perf_counter() - t0:.1f} s")
        raise
    except BaseException:
        say(f"{name}: failed after {time.perf_counter() - t0:.1f} s")
        raise
    say(f"{name}: done in {time.perf_counter() - t0:.1f} s")
