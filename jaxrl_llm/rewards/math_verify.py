"""Math-answer reward by symbolic equivalence, with Hugging Face's ``math-verify`` package.

:func:`math_answer_reward` compares numbers exactly; this reward also accepts answers that are
equal as mathematical objects: ``1/2`` = ``0.5`` = ``\\frac{1}{2}`` = ``\\boxed{\\frac12}``,
``\\frac{\\sqrt{2}}{2}`` = ``\\sqrt{2}/2``, ``(x+1)^2`` = ``x^2+2x+1``, intervals, sets and
matrices. ``math-verify`` (https://github.com/huggingface/Math-Verify) extracts the answer of
a reply (a ``\\boxed{}`` answer first, then other LaTeX, then a plain expression), parses it
to SymPy and compares it with the parsed reference numerically and symbolically; it is the
verifier of Open R1 and lighteval's MATH tasks.

Every sample has a wall-clock budget (``timeout_seconds``): SymPy can take unbounded time on
adversarial expressions. In the main thread the budget is a ``SIGALRM`` timer around the
whole sample (the package's own per-call alarms are disabled so they cannot clobber it);
elsewhere, where signals cannot be used, the sample runs in a daemon thread and is abandoned
at the deadline (the thread finishes in the background). A sample that runs out of time
scores 0.0, like an answer that cannot be parsed.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from jaxrl_llm.errors import RewardError


class _Deadline(BaseException):
    """Raised by our timer; a BaseException so the package's ``except Exception`` lets it by."""


class _QuietTimeoutWarning(logging.Filter):
    """Drops math-verify's one-off "timeout is disabled" warning: we enforce our own budget."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


def _import():
    try:
        import math_verify
    except ImportError as e:  # pragma: no cover - exercised only without the package
        raise RewardError(
            "math_verify_reward needs the math-verify package: "
            "pip install 'math-verify[antlr4_13_2]'"
        ) from e
    logging.getLogger("math_verify.parser").addFilter(_QuietTimeoutWarning())
    logging.getLogger("math_verify.grader").addFilter(_QuietTimeoutWarning())
    return math_verify


def _gold_text(reference: Any) -> str:
    """The reference as text math-verify can parse: GSM8K ``#### x`` → ``x``; bare LaTeX in
    ``$…$`` so that ``\\frac{1}{2}`` or ``\\pi`` parse without delimiters."""
    text = str(reference).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text:
        return text
    return f"${text}$"


def _with_deadline(fn, seconds: float):
    """``fn()`` within ``seconds`` of wall clock, or raise :class:`_Deadline`."""
    if threading.current_thread() is threading.main_thread():

        def on_alarm(signum, frame):
            raise _Deadline()

        old_handler = signal.signal(signal.SIGALRM, on_alarm)
        start = time.monotonic()
        outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
            if outer > 0:  # give an enclosing timer its remaining time back
                left = outer - (time.monotonic() - start)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3))
    result: list = []
    worker = threading.Thread(target=lambda: result.append(fn()), daemon=True, name="math-verify")
    worker.start()
    worker.join(seconds)
    if worker.is_alive() or not result:
        raise _Deadline()
    return result[0]


def math_verify_reward(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer: Sequence[Any],
    timeout_seconds: float = 5.0,
    **_fields,
) -> list[float | None]:
    """Answer accuracy by mathematical equivalence: 1.0 if the reply's answer equals the
    reference as a mathematical object (``math-verify``), else 0.0.

    The rule-based accuracy reward of RLVR / DeepSeek-R1 (https://arxiv.org/abs/2501.12948)
    with a symbolic checker instead of string or number matching. The reply's answer is the
    last ``\\boxed{}`` if any, else its LaTeX or plain expressions (``math-verify``'s default
    extraction); the reference may be plain (``"0.5"``, ``"1/2"``), LaTeX with or without
    ``$`` (``"\\frac{1}{2}"``), boxed, or a GSM8K ``"#### 42"`` line. Bind options with
    ``functools.partial``; it plugs into :class:`~jaxrl_llm.rewards.RewardSet` like
    :func:`~jaxrl_llm.rewards.math_answer_reward`.

    Example::

        replies = ["\\\\boxed{0.5}", "so x = 1/2", "3"]
        math_verify_reward(["q"] * 3, replies, answer=["\\\\frac{1}{2}"] * 3)  # [1.0, 1.0, 0.0]

    Args:
      prompts: N prompts (unused). completions: N replies.
      answer: N reference answers; None gives None (no score) for that sample.
      timeout_seconds: wall-clock budget per sample (parsing both sides and comparing),
        > 0. A sample over budget scores 0.0.

    Returns:
      N floats in {0.0, 1.0}; None where the reference is None or cannot be parsed (the
      sample is then marked invalid rather than scored wrong).
    """
    if not timeout_seconds > 0 or not math.isfinite(timeout_seconds):
        raise RewardError(
            f"math_verify_reward: timeout_seconds={timeout_seconds} must be a finite number > 0"
        )
    mv = _import()
    gold_cache: dict[str, list] = {}
    out: list[float | None] = []
    for text, ref in zip(completions, answer, strict=True):
        if ref is None:
            out.append(None)
            continue

        def score(text=text, ref=ref):
            key = _gold_text(ref)
            if key not in gold_cache:
                gold = mv.parse(key, parsing_timeout=None)
                gold_cache[key] = gold or mv.parse(str(ref), parsing_timeout=None)
            gold = gold_cache[key]
            if not gold:
                return None
            pred = mv.parse(str(text), parsing_timeout=None)
            return 1.0 if pred and mv.verify(gold, pred, timeout_seconds=None) else 0.0

        try:
            out.append(_with_deadline(score, float(timeout_seconds)))
        except _Deadline:
            out.append(0.0)
    return out
