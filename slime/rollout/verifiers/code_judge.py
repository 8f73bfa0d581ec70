"""The checks of a split assert (``code_asserts``), evaluated in the verifier's process over plain values.

``judge`` runs a small evaluator, never ``eval``: literals, comparisons, boolean, arithmetic and
conditional expressions, subscripts, calls of pure builtins (``JUDGE_FUNCTIONS``), ``math``/``cmath``
attributes (and what a test's setup imports from them), a few constants of ``sys`` and ``string``, and
pure methods of built-in values (``METHODS``). ``validate`` refuses anything else when the test is
loaded (``PluginError`` naming the form), so the sample is FAILED rather than scored.

The values come from the program, so everything that could grow with them is bounded (``code_bounds``:
``ValueError`` past a size limit, and the case fails), since the evaluator runs on the event loop and
must neither stall it nor exhaust its memory. A probe that raised in the program is
an error only when the check reaches it (``a() is None or b() == 0`` short-circuits as in Python).
"""

from __future__ import annotations

import ast
import builtins
import cmath
import math
import operator
import string
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from slime.errors import PluginError
from slime.rollout.verifiers.code_bounds import (
    Value,
    bounded_bytes,
    bounded_pow,
    bounded_prod,
    bounded_range,
    bounded_sum,
    check_call,
    check_size,
)

__all__ = ["ALL_METHODS", "JUDGE_FUNCTIONS", "JUDGE_MODULES", "METHODS", "judge", "validate"]


JUDGE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{
        name: getattr(builtins, name)
        for name in (
            "abs", "all", "any", "bin", "bool", "chr", "complex", "dict", "divmod", "enumerate", "float", "frozenset",
            "hex", "int", "isinstance", "len", "list", "max", "min", "oct", "ord", "repr", "reversed", "round", "set",
            "sorted", "str", "sum", "tuple", "type", "zip",
        )
    },
    "range": bounded_range,
    "bytes": bounded_bytes,
    "pow": bounded_pow,
    "sum": bounded_sum,
}  # fmt: skip
"""Builtins a check may call: pure functions of built-in values (and the types for ``isinstance``)."""
_MATH = types.SimpleNamespace(
    **{**{k: v for k, v in vars(math).items() if not k.startswith("_")}, "prod": bounded_prod}
)
JUDGE_MODULES: dict[str, Any] = {
    "math": _MATH,
    "cmath": cmath,
    "sys": types.SimpleNamespace(maxsize=sys.maxsize, float_info=sys.float_info),
    "string": types.SimpleNamespace(
        **{k: v for k, v in vars(string).items() if isinstance(v, str) and not k.startswith("_")}
    ),
}
"""Modules a check may read attributes of (no dunders); always the real ones, never the program's."""
METHODS: dict[type, frozenset[str]] = {
    str: frozenset(
        "split rsplit join strip lstrip rstrip upper lower title capitalize casefold swapcase replace splitlines "
        "startswith endswith count find rfind index rindex isdigit isalpha isalnum isspace islower isupper isdecimal "
        "isnumeric partition rpartition encode".split()
    ),
    bytes: frozenset("split join strip upper lower replace startswith endswith count find index decode hex".split()),
    list: frozenset({"count", "index"}),
    tuple: frozenset({"count", "index"}),
    dict: frozenset({"keys", "values", "items", "get"}),
    set: frozenset("issubset issuperset isdisjoint union intersection difference symmetric_difference".split()),
    frozenset: frozenset("issubset issuperset isdisjoint union intersection difference symmetric_difference".split()),
}
"""Methods a check may call, by the exact type of the value (checked when it runs)."""
ALL_METHODS = frozenset().union(*METHODS.values())

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift,
    ast.RShift: operator.rshift, ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.BitAnd: operator.and_,
}  # fmt: skip
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert,
}  # fmt: skip
_NODES = (
    ast.Constant, ast.Name, ast.Load, ast.Attribute, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp,
    ast.BoolOp, ast.Compare, ast.IfExp, ast.Subscript, ast.Slice, ast.Call, ast.keyword,
    ast.cmpop, ast.operator, ast.unaryop, ast.boolop,
)  # fmt: skip


class ProbeFailed(Exception):
    """A check reached a probe that raised (or returned something unencodable) in the program."""


def validate(check: ast.expr, source: str, names: Mapping[str, Value]) -> None:
    """Refuse a check the evaluator would not evaluate.

    Args:
        check: the rewritten test expression (probes as ``_probe_<k>`` names).
        source: the assert's text, for the message.
        names: extra names the check may read (what the setup imports from ``math``/``cmath``).

    Raises:
        PluginError: naming the form.
    """

    def refuse(why: str) -> PluginError:
        return PluginError(
            f"code verifier: test {source[:200]!r}: {why}, which the verifier cannot judge outside the program"
        )

    for sub in ast.walk(check):
        if not isinstance(sub, _NODES):
            raise refuse(f"it uses {type(sub).__name__}")
        if isinstance(sub, ast.keyword) and sub.arg is None:
            raise refuse("it passes ** arguments")
        if isinstance(sub, ast.Dict) and any(k is None for k in sub.keys):
            raise refuse("it unpacks ** into a dict")
        if isinstance(sub, ast.Attribute) and not _readable_attribute(sub, names):
            raise refuse(f"it reads .{sub.attr}")
        if isinstance(sub, ast.Name) and not (
            sub.id in JUDGE_FUNCTIONS or sub.id in JUDGE_MODULES or sub.id in names or sub.id.startswith("_probe_")
        ):
            if hasattr(builtins, sub.id):
                raise refuse(f"it uses the builtin {sub.id!r}")
            raise refuse(f"it names {sub.id!r} without calling it (only the solution's calls are asked of the program)")


def _readable_attribute(node: ast.Attribute, names: Mapping[str, Value]) -> bool:
    if node.attr.startswith("_"):
        return False
    value = node.value
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "sys":
        return value.attr == "float_info"  # sys.float_info.max: the one constant owner below a module
    module_attribute = isinstance(value, ast.Name) and (
        value.id in JUDGE_MODULES or _is_judge_module(names.get(value.id))
    )
    return module_attribute or node.attr in ALL_METHODS


def _is_judge_module(value: Value) -> bool:
    return isinstance(value, types.ModuleType) or any(value is m for m in JUDGE_MODULES.values())


def judge(
    checks: Sequence[ast.expr],
    probes: Sequence[str],
    outcomes: Sequence[tuple[bool, Value]],
    source: str,
    names: Mapping[str, Value],
) -> tuple[bool, str]:
    """Evaluate ``checks`` over the probes' outcomes (``(True, value)`` or ``(False, why)``, in ``probes`` order).

    Returns:
        (passed, why): ``why`` names the assert and what the program returned, or the probe that failed.
    """
    env = {f"_probe_{k}": outcome for k, outcome in enumerate(outcomes)}
    evaluator = _Evaluator(env, names)
    shown = _shown(source, probes, outcomes)
    for check in checks:
        try:
            ok = bool(evaluator.eval(check))
        except ProbeFailed as exc:
            return False, f"{source[:200]!r}: {exc}"
        except Exception as exc:  # the program's values made the check raise (e.g. len() of an int)
            return False, f"{shown}: the check raised {type(exc).__name__}: {str(exc)[:200]}"
        if not ok:
            return False, f"{shown}: assertion failed"
    return True, "ok"


def _shown(source: str, probes: Sequence[str], outcomes: Sequence[tuple[bool, Value]]) -> str:
    got = ", ".join(f"{probe} returned {_safe_repr(value)}" for probe, (ok, value) in zip(probes, outcomes) if ok)
    return f"{source[:200]!r}" + (f" ({got})" if got else "")


def _safe_repr(value: Value) -> str:
    try:
        return repr(value)[:120]
    except ValueError:  # an int past Python's 4300-digit str limit
        return f"<{type(value).__name__} too large to show>"


class _Evaluator:
    """Evaluates validated checks; one method per expression form."""

    def __init__(self, env: dict[str, tuple[bool, Value]], names: Mapping[str, Value]):
        self.env, self.names = env, names

    def eval(self, node: ast.expr) -> Value:
        method: Callable[[Any], Any] = getattr(self, f"_eval_{type(node).__name__}")
        return method(node)

    def _eval_Constant(self, node: ast.Constant) -> Value:
        return node.value

    def _eval_Name(self, node: ast.Name) -> Value:
        if node.id in self.env:
            ok, value = self.env[node.id]
            if not ok:
                raise ProbeFailed(f"{value}")
            return value
        if node.id in self.names:
            return self.names[node.id]
        return JUDGE_FUNCTIONS.get(node.id) or JUDGE_MODULES[node.id]

    def _eval_Attribute(self, node: ast.Attribute) -> Value:
        owner = self.eval(node.value)
        is_module = _is_judge_module(owner) or owner is sys.float_info
        if is_module or node.attr in METHODS.get(type(owner), ()):
            return getattr(owner, node.attr)
        raise TypeError(f"a {type(owner).__name__} has no .{node.attr} the verifier calls")

    def _eval_List(self, node: ast.List) -> Value:
        return [self.eval(e) for e in node.elts]

    def _eval_Tuple(self, node: ast.Tuple) -> Value:
        return tuple(self.eval(e) for e in node.elts)

    def _eval_Set(self, node: ast.Set) -> Value:
        return {self.eval(e) for e in node.elts}

    def _eval_Dict(self, node: ast.Dict) -> Value:
        return {self.eval(k): self.eval(v) for k, v in zip(node.keys, node.values) if k is not None}

    def _eval_UnaryOp(self, node: ast.UnaryOp) -> Value:
        return _UNARY[type(node.op)](self.eval(node.operand))

    def _eval_BinOp(self, node: ast.BinOp) -> Value:
        left, right = self.eval(node.left), self.eval(node.right)
        if not (_is_literal(node.left) and _is_literal(node.right)):  # the test's own constants need no bound
            check_size(node.op, left, right)
        return _BINARY[type(node.op)](left, right)

    def _eval_BoolOp(self, node: ast.BoolOp) -> Value:
        value: Any = None
        for operand in node.values:
            value = self.eval(operand)
            if bool(value) != isinstance(node.op, ast.And):  # short-circuit as Python does
                return value
        return value

    def _eval_Compare(self, node: ast.Compare) -> Value:
        left = self.eval(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = self.eval(comparator)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _eval_IfExp(self, node: ast.IfExp) -> Value:
        return self.eval(node.body) if self.eval(node.test) else self.eval(node.orelse)

    def _eval_Subscript(self, node: ast.Subscript) -> Value:
        return self.eval(node.value)[self.eval(node.slice)]

    def _eval_Slice(self, node: ast.Slice) -> Value:
        return slice(*(None if p is None else self.eval(p) for p in (node.lower, node.upper, node.step)))

    def _eval_Call(self, node: ast.Call) -> Value:
        fn = self.eval(node.func)
        args = [self.eval(a) for a in node.args]
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg is not None}
        return fn(*check_call(fn, args), **kwargs)


def _is_literal(node: ast.expr) -> bool:
    """A constant or a tuple of constants written in the test (``'%.2f' % 0.5``, ``'%d-%d' % (1, 2)``)."""
    return isinstance(node, ast.Constant) or (
        isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts)
    )
