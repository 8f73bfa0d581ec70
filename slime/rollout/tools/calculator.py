"""The ``calculator`` tool: safe arithmetic over an ``ast`` walk (nothing is ``eval``-ed).

Allowed: int and float literals, ``+ - * / // % **``, unary ``+ -`` and parentheses (``×`` and
``÷`` are read as ``*`` and ``/``). Everything else is rejected with a message naming it: names,
calls, attributes, subscripts, strings, comparisons, lambdas, ``^`` (told to use ``**``).

Size guards, so one call cannot stall the rollout: the expression is at most 512 characters and
64 nodes deep; a power whose result would need more than 4096 bits (``|base|`` bits x exponent)
is refused, and so is any integer operand or result past 4096 bits (about 1233 digits).

Example::

    evaluate("(3 + 4) * 2 ** 10")   # "7168"
    evaluate("__import__('os')")    # raises CalculatorError("calls are not allowed: ...")
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from slime.rollout.tools.registry import Tool

__all__ = ["CalculatorError", "evaluate", "calculator_tool", "MAX_EXPRESSION_CHARS", "MAX_INT_BITS"]

MAX_EXPRESSION_CHARS = 512
MAX_DEPTH = 64
MAX_INT_BITS = 4096

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_REJECTED = {
    ast.Name: "names are not allowed",
    ast.Call: "calls are not allowed",
    ast.Attribute: "attributes are not allowed",
    ast.Subscript: "subscripts are not allowed",
    ast.Compare: "comparisons are not allowed",
    ast.Lambda: "lambdas are not allowed",
}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, too big, or fails (e.g. division by zero)."""


def evaluate(expression: str) -> str:
    """Evaluate ``expression``; returns the value as text (floats with 12 significant digits).

    Raises:
        CalculatorError: naming what was refused or what failed.
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.replace("×", "*").replace("÷", "/").strip()
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression has {len(text)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    value = _eval(tree.body, 0)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError(f"result is {value}")
        return format(value, ".12g")
    return str(value)


def _eval(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"expression is nested deeper than {MAX_DEPTH}")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"only numbers are allowed, got {type(node.value).__name__} {node.value!r}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _checked(_BINOPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result is too large") from None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise CalculatorError("'^' is bitwise xor; write powers as '**'")
    for kind, message in _REJECTED.items():
        if isinstance(node, kind):
            raise CalculatorError(f"{message}: {ast.unparse(node)[:80]!r}")
    raise CalculatorError(f"{type(node).__name__} is not allowed in arithmetic: {ast.unparse(node)[:80]!r}")


def _check_power(base: int | float, exponent: int | float) -> None:
    if isinstance(exponent, complex) or abs(exponent) > 1_000_000:
        raise CalculatorError(f"exponent {exponent} is too large")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        if max(base.bit_length(), 1) * exponent > MAX_INT_BITS and abs(base) > 1:
            raise CalculatorError(f"{base} ** {exponent} would have more than {MAX_INT_BITS} bits")


def _checked(value: Any) -> int | float:
    if isinstance(value, complex):
        raise CalculatorError("result is a complex number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError(f"integer has more than {MAX_INT_BITS} bits")
    return value


async def _calculator(arguments: dict[str, Any]) -> str:
    return evaluate(arguments.get("expression", ""))


def calculator_tool() -> Tool:
    """The ``calculator`` tool for a ``ToolRegistry``; a refused expression becomes an error message."""
    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 2 ** 10"}},
            "required": ["expression"],
        },
        fn=_calculator,
    )
