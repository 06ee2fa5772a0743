"""Verifiable math-answer rewards: extract a final answer and compare it numerically.

Extraction order (first that applies): a GSM8K ``#### answer`` line (Cobbe et al. 2021,
https://arxiv.org/abs/2110.14168), the last ``\\boxed{...}`` (balanced braces, as in the MATH
data set, Hendrycks et al. 2021, https://arxiv.org/abs/2103.03874), then the last number in the
text. Numbers compare exactly as fractions: "1,234" = "1234.0", "3/4" = "0.75", "-5" = "−5",
"50%" stays 50 (percent signs are dropped), "$1,000" = 1000, "\\frac{3}{4}" = 0.75.
"""

from __future__ import annotations

import enum
import fractions
import re
from collections.abc import Sequence

_NUMBER_RE = re.compile(
    r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
    r"(?:\s*/\s*\d+(?:\.\d+)?)?|(?<![\w\d])[-+−]?\.\d+"
)
_GSM8K_RE = re.compile(r"####\s*([^\n]*)")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_STRICT_STRIP = " \t\n\r.$*`"


class AnswerSource(str, enum.Enum):
    """Where :func:`extract_answer` found the answer."""

    GSM8K = "gsm8k"  # "#### 42"
    BOXED = "boxed"  # \\boxed{42}
    LAST_NUMBER = "last_number"


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), with nested braces, or None."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def extract_last_number(text: str) -> str | None:
    """The last number-like token ("-1,234.5", "3/4", ".5") in ``text``, or None."""
    matches = _NUMBER_RE.findall(text)
    return matches[-1].strip() if matches else None


def extract_answer(text: str) -> tuple[str | None, AnswerSource | None]:
    """The final answer string of a reply and where it came from (GSM8K → boxed → last number).

    Args:
      text: a model reply or a reference solution.

    Returns:
      ``(answer, source)``, or ``(None, None)`` when nothing is found.
    """
    m = _GSM8K_RE.findall(text)
    if m and m[-1].strip():
        return m[-1].strip(), AnswerSource.GSM8K
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed, AnswerSource.BOXED
    last = extract_last_number(text)
    if last is not None:
        return last, AnswerSource.LAST_NUMBER
    return None, None


def parse_number(text: str | int | float | None) -> fractions.Fraction | None:
    """An exact number from an answer string, or None if it is not a single number.

    Accepts thousands separators ("1,234"), decimals ("1234.0", ".5"), fractions ("3/4",
    "\\frac{3}{4}"), a unicode minus, and surrounding "$", "%", "\\text{...}" units, and
    LaTeX spacing. ``parse_number("3/4") == parse_number("0.75")``.
    """
    if text is None:
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        try:
            return fractions.Fraction(text)
        except (ValueError, OverflowError):
            return None
    s = str(text).strip()
    s = _FRAC_RE.sub(r"(\1)/(\2)", s)
    s = re.sub(r"\\text\{[^{}]*\}|\\[,!;: ]|\\left|\\right|\\\$|\$|%|\\%", "", s)
    s = s.replace("−", "-").replace("{", "").replace("}", "").replace(" ", "")
    s = s.rstrip(".")
    if s.startswith("(") and s.endswith(")") and s.count("(") == 1:
        s = s[1:-1]
    pieces = [_parse_simple(x) for x in s.split("/")]
    parts = [x for x in pieces if x is not None]
    if len(pieces) > 2 or len(parts) != len(pieces):
        return None
    if len(parts) == 2:
        return None if parts[1] == 0 else parts[0] / parts[1]
    return parts[0]


_SIMPLE_RE = re.compile(r"([-+]?)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d*\.?\d+)")


def _parse_simple(s: str) -> fractions.Fraction | None:
    """A plain number ("-1,234.5", "(3)", "+.5") as a Fraction; None otherwise."""
    if s.startswith("(") and s.endswith(")"):
        s = s[1:-1]
    m = _SIMPLE_RE.fullmatch(s)
    if not m:
        return None
    value = fractions.Fraction(m.group(2).replace(",", ""))
    return -value if m.group(1) == "-" else value


def answers_match(
    predicted: str | None, reference: str | int | float | None, *, rel_tol: float = 0.0
) -> bool:
    """Numeric equivalence of two answers; falls back to whitespace-normalised string equality.

    Args:
      predicted: extracted model answer.
      reference: reference answer (a string like "#### 42" or "42", or a number).
      rel_tol: relative tolerance; 0 means exact (as rationals).
    """
    if predicted is None or reference is None:
        return False
    if isinstance(reference, str) and "####" in reference:
        reference = extract_answer(reference)[0]
    p, r = parse_number(predicted), parse_number(reference)
    if p is not None and r is not None:
        if rel_tol == 0.0:
            return p == r
        return abs(p - r) <= rel_tol * max(abs(p), abs(r))
    if p is None and r is None:
        norm = lambda s: re.sub(r"\s+", "", str(s)).lower()  # noqa: E731
        return norm(predicted) == norm(reference)
    return False


def math_answer_reward(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer: Sequence[str | int | float | None],
    strict: bool = False,
    rel_tol: float = 0.0,
    **_fields,
) -> list[float | None]:
    """Answer accuracy: r_i = 1 if the extracted answer of completion i equals answer_i, else 0.

    The rule-based accuracy reward of RLVR / DeepSeek-R1 (https://arxiv.org/abs/2501.12948)
    and Tülu 3 (https://arxiv.org/abs/2411.15124). Bind options with ``functools.partial``.

    Args:
      prompts: N prompts (unused). completions: N replies.
      answer: N reference answers (``"#### 42"``, ``"42"``, ``"3/4"``, or numbers); None gives
        None (no score) for that sample.
      strict: require the whole reply to be just the number (surrounding whitespace, a final
        period, ``$`` or ``**`` allowed) — for "Reply with just the number" tasks.
      rel_tol: relative tolerance for the numeric comparison (default exact).

    Returns:
      N floats in {0.0, 1.0} (None where the reference is None).
    """
    out: list[float | None] = []
    for text, ref in zip(completions, answer, strict=True):
        if ref is None:
            out.append(None)
            continue
        if strict:
            pred = text.strip(_STRICT_STRIP)
            ok = parse_number(pred) is not None and answers_match(pred, ref, rel_tol=rel_tol)
        else:
            ok = answers_match(extract_answer(text)[0], ref, rel_tol=rel_tol)
        out.append(1.0 if ok else 0.0)
    return out
