"""A calculator that evaluates arithmetic and nothing else (no ``eval``).

The expression is parsed with :mod:`ast` and walked by hand: numbers, ``+ - * / // %``,
``**`` (``^`` is read as a power, ``×`` and ``÷`` as ``*`` and ``/``), unary signs and
parentheses. Everything else — names, attributes, calls, subscripts, strings, comparisons —
is refused with a :class:`CalculatorError` that says what was found. Sizes are bounded so a
model cannot make the host compute forever: at most 200 characters, exponents with at most
|e| ≤ 1000 and an estimated result of at most 10,000 bits, integer results up to 10^300.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

MAX_CHARS = 200
MAX_EXPONENT = 1000
MAX_BITS = 10_000
MAX_INT = 10**300

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression is not arithmetic the calculator evaluates (the message says why)."""


def _bits(x: int | float) -> float:
    return math.log2(abs(x)) if x else 0.0


def _power(base: int | float, exp: int | float) -> int | float:
    if abs(exp) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exp} is too large (at most {MAX_EXPONENT})")
    if _bits(base) * abs(exp) > MAX_BITS:
        raise CalculatorError("the result would be too large")
    if base == 0 and exp < 0:
        raise CalculatorError("division by zero")
    return base**exp


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"only numbers are allowed, got {node.value!r}")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            out = _power(left, right)
        else:
            if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
                raise CalculatorError("division by zero")
            out = _BINARY[type(node.op)](left, right)
        if isinstance(out, complex):
            raise CalculatorError("the result is not a real number")
        if isinstance(out, int) and abs(out) > MAX_INT:
            raise CalculatorError("the result is too large")
        if isinstance(out, float) and not math.isfinite(out):
            raise CalculatorError("the result is too large")
        return out
    what = type(node).__name__
    if isinstance(node, ast.Name):
        what = f"the name {node.id!r}"
    elif isinstance(node, ast.Call):
        what = "a function call"
    elif isinstance(node, ast.Attribute):
        what = "an attribute"
    raise CalculatorError(
        f"only arithmetic is allowed (numbers, + - * / // % ** and parentheses), got {what}"
    )


def format_number(x: int | float) -> str:
    """An integer as its digits; a float with up to 12 significant digits (an integral float
    below 10^15 as an integer)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    if isinstance(x, float):
        return f"{x:.12g}"
    return str(x)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. "123 * 456 + 7".

    Args:
      expression: numbers with + - * / // % ** (or ^) and parentheses.
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r} as arithmetic") from None
    except (ValueError, MemoryError, RecursionError):
        raise CalculatorError(f"cannot parse {expression!r}") from None
    try:
        return format_number(_eval(tree))
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None
    except OverflowError:
        raise CalculatorError("the result is too large") from None
