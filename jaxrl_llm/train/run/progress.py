"""Lines for the long phases of a run: a line when a phase starts and one when it ends, with
its time (``model load: started`` ... ``model load: done in 41.2 s``), so that minutes of
loading, converting or evaluating are not minutes of silence; a tqdm bar where the work has a
count (eval batches), drawn only on a terminal unless :data:`ENV_PROGRESS` asks. Main process
only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from jaxrl_llm.errors import JaxrlError

T = TypeVar("T")


def _main_process() -> bool:
    import jax

    return jax.process_index() == 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def phase(name: str, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Say ``"{name}: started"`` now and ``"{name}: done in {s} s"`` (or ``"{name}: failed
    after {s} s"`` on an unexpected error, or ``"stopped after"`` on Ctrl-C) when the block
    ends; a :class:`jaxrl_llm.errors.JaxrlError` adds no line (the CLI prints it as the one
    line that says what went wrong). ``say`` defaults to a line on stderr from the main
    process.

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
    except Exception as e:
        if not isinstance(e, JaxrlError):  # a user's error is its own one line (the CLI's)
            say(f"{name}: failed after {time.perf_counter() - t0:.1f} s")
        raise
    say(f"{name}: done in {time.perf_counter() - t0:.1f} s")


#: Environment variable that turns the progress bars on where stderr is not a terminal (a log
#: file, CI): ``1``; ``0`` turns them off on a terminal too.
ENV_PROGRESS = "JAXRL_LLM_PROGRESS"


def bars_on() -> bool:
    """Whether progress bars are drawn: :data:`ENV_PROGRESS` when set, else only where stderr
    is a terminal (a non-interactive log gets the phase lines alone)."""
    value = os.environ.get(ENV_PROGRESS, "").strip().lower()
    if value:
        return value not in ("0", "false", "no", "off")
    return sys.stderr.isatty()


def bar(iterable: Iterable[T], *, total: int, desc: str) -> Iterable[T]:
    """``iterable`` with a tqdm bar of ``total`` items named ``desc`` on stderr, from the main
    process when :func:`bars_on`; else ``iterable`` itself."""
    if not (bars_on() and _main_process()):
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, leave=False, mininterval=0.5)
