"""The checks of a split assert (``code_asserts``), evaluated in the verifier's process over plain values.

``judge`` runs a small evaluator, never ``eval``: literals, comparisons, boolean, arithmetic and
conditional expressions, subscripts, calls of pure builtins (``JUDGE_FUNCTIONS``), ``math``/``cmath``
attributes (and what a test's setup imports from them), a few constants of ``sys`` and ``string``, and
pure methods of built-in values (``METHODS``). ``validate`` refuses anything else when the test is
loaded (``PluginError`` naming the form), so the sample is FAILED rather than scored.

The values come from the program, so everything that could grow with them is bounded: repetition,
``%`` formatting, powers, ``range``, ``bytes(n)``, ``str.replace`` and the combinatorial ``math``
functions raise ``ValueError`` past a size limit (the case fails), since the evaluator runs on the
event loop and must neither stall it nor exhaust its memory. A probe that raised in the program is
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
from typing import Any, TypeAlias

from slime.errors import PluginError

__all__ = ["ALL_METHODS", "MAX_SAME_HASH", "refuse_hash_floods", "JUDGE_FUNCTIONS", "JUDGE_MODULES", "METHODS", "judge", "validate"]

Value: TypeAlias = Any
"""A built-in value the program returned (``code_harness.decode_value``) or the check computes from one:
dynamically typed by nature (the evaluator applies Python's own operators to it), hence ``Any``."""

MAX_SIZE = 1 << 20
"""Largest sequence (items or characters) or ``range`` the evaluator builds from the program's values."""
_MAX_POW_BITS = 1 << 20
_MAX_INT_BITS = 1 << 17
"""Largest int (in bits, ~39k digits) that multiplies, divides or enters a call: CPython's ``//``, ``%``
and ``gcd`` are quadratic in the digits, and the channel can carry ints of millions of bits."""
_MAX_COMBINATORIAL_ARG = 100_000
_COMBINATORIAL = (math.factorial, math.comb, math.perm)
_LINEAR_IN_INTS = frozenset({"isinstance", "type", "len", "bool", "abs", "max", "min", "sorted", "list", "tuple", "set"})
"""Calls whose cost stays linear in the digits of their int arguments (no bound on those)."""


def _bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_SIZE:
        raise ValueError(f"a range of more than {MAX_SIZE} items")
    return r


def _bounded_bytes(*args: Value) -> bytes:
    if args and isinstance(args[0], int) and args[0] > MAX_SIZE:
        raise ValueError(f"bytes of more than {MAX_SIZE}")
    return bytes(*args)


def _check_pow(base: Value, exp: Value) -> None:
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base).bit_length() * exp > _MAX_POW_BITS:
        raise ValueError(f"a power of more than {_MAX_POW_BITS} bits")


def _bounded_pow(base: Value, exp: Value, mod: Value = None) -> Value:
    if mod is None:
        _check_pow(base, exp)
    elif isinstance(exp, int) and isinstance(mod, int) and abs(mod).bit_length() * exp.bit_length() > _MAX_POW_BITS * 16:
        raise ValueError("a modular power too costly to judge")  # one squaring mod ``mod`` per bit of ``exp``
    return pow(base, exp, mod)


def _bounded_sum(items: Value, start: Value = 0) -> Value:
    """``sum`` where a sequence ``start`` concatenates in linear time (``sum(lists, [])`` copies its whole
    total once per item in CPython) and within ``MAX_SIZE``."""
    if not isinstance(start, list | tuple | str | bytes):
        return sum(items, start)
    if isinstance(start, str | bytes):
        raise TypeError("sum() can't sum strings [use ''.join(seq) instead]")
    out = list(start)
    for item in items:
        if type(item) is not type(start):
            raise TypeError(f"can only concatenate {type(start).__name__} to {type(start).__name__}")
        out.extend(item)
        if len(out) > MAX_SIZE:
            raise ValueError(f"a sum longer than {MAX_SIZE}")
    return type(start)(out)


def _bounded_prod(items: Value, *, start: Value = 1) -> Value:
    """``math.prod`` with every partial product within ``_MAX_INT_BITS``."""
    out = start
    for item in items:
        _check_int(out)
        _check_int(item)
        out = out * item
    _check_int(out)
    return out


def _unflooded(items: Value = ()) -> list[Value]:
    """``items`` as a list, refused (ValueError) when a set of them would be a hash flood (``code_harness``)."""
    members = list(items)
    refuse_hash_floods(members)
    return members


def _unflooded_dict(items: Value = (), **kwargs: Value) -> dict[Value, Value]:
    """``dict(items, **kwargs)``, refused when its keys would be a hash flood (checked before it is built)."""
    pairs = list(items.items() if isinstance(items, dict) else items)
    refuse_hash_floods([pair[0] for pair in pairs if isinstance(pair, tuple | list) and len(pair) == 2])
    return dict(pairs, **kwargs)


MAX_SAME_HASH = 64
"""Most members of one decoded set or dict that may share a hash: each insert probes past all earlier
members of its hash, so 100k crafted ints (``k * (2**61 - 1)``) would take the verifier minutes."""


def refuse_hash_floods(members: list[Value]) -> None:
    """Raise ValueError when more than ``MAX_SAME_HASH`` members share a hash (counted in linear time:
    hash values are small distinct ints, so counting them is itself collision-free)."""
    if len(members) <= MAX_SAME_HASH:
        return
    counts: dict[int, int] = {}
    for member in members:
        h = hash(member)  # TypeError for an unhashable member, as set() would raise
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > MAX_SAME_HASH:
            raise ValueError(f"more than {MAX_SAME_HASH} members of a set or dict share one hash")


def _check_int(value: Value) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_INT_BITS:
        raise ValueError(f"an int of more than {_MAX_INT_BITS} bits")


JUDGE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{
        name: getattr(builtins, name)
        for name in (
            "abs", "all", "any", "bin", "bool", "chr", "complex", "dict", "divmod", "enumerate", "float", "frozenset",
            "hex", "int", "isinstance", "len", "list", "max", "min", "oct", "ord", "repr", "reversed", "round", "set",
            "sorted", "str", "sum", "tuple", "type", "zip",
        )
    },
    "range": _bounded_range,
    "bytes": _bounded_bytes,
    "pow": _bounded_pow,
    "sum": _bounded_sum,
    "set": lambda *a: set(_unflooded(*a)),
    "frozenset": lambda *a: frozenset(_unflooded(*a)),
    "dict": lambda *a, **k: _unflooded_dict(*a, **k),
}  # fmt: skip
"""Builtins a check may call: pure functions of built-in values (and the types for ``isinstance``)."""
_MATH = types.SimpleNamespace(**{**{k: v for k, v in vars(math).items() if not k.startswith("_")}, "prod": _bounded_prod})
JUDGE_MODULES: dict[str, Any] = {
    "math": _MATH,
    "cmath": cmath,
    "sys": types.SimpleNamespace(maxsize=sys.maxsize, float_info=sys.float_info),
    "string": types.SimpleNamespace(**{k: v for k, v in vars(string).items() if isinstance(v, str) and not k.startswith("_")}),
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
        return PluginError(f"code verifier: test {source[:200]!r}: {why}, which the verifier cannot judge outside the program")

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
    module_attribute = isinstance(value, ast.Name) and (value.id in JUDGE_MODULES or _is_judge_module(names.get(value.id)))
    return module_attribute or node.attr in ALL_METHODS


def _is_judge_module(value: Value) -> bool:
    return isinstance(value, types.ModuleType) or any(value is m for m in JUDGE_MODULES.values())


def judge(
    checks: Sequence[ast.expr], probes: Sequence[str], outcomes: Sequence[tuple[bool, Value]], source: str, names: Mapping[str, Value]
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
            _check_size(node.op, left, right)
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
        _check_call(fn, args)
        return fn(*args, **kwargs)


def _is_literal(node: ast.expr) -> bool:
    """A constant or a tuple of constants written in the test (``'%.2f' % 0.5``, ``'%d-%d' % (1, 2)``)."""
    return isinstance(node, ast.Constant) or (isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts))


def _check_size(op: ast.operator, left: Value, right: Value) -> None:
    """Raise ValueError where ``left op right`` would grow past the bounds (module docstring)."""
    if not isinstance(op, ast.Add | ast.Sub | ast.BitOr | ast.BitAnd | ast.BitXor | ast.RShift):  # linear in the digits
        _check_int(left)
        _check_int(right)
    if isinstance(op, ast.LShift) and isinstance(right, int) and right > _MAX_POW_BITS:
        raise ValueError(f"a shift by more than {_MAX_POW_BITS} bits")
    if isinstance(op, ast.Mult):
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, str | bytes | list | tuple) and isinstance(count, int) and len(seq) * count > MAX_SIZE:
                raise ValueError(f"a repetition longer than {MAX_SIZE}")
    if isinstance(op, ast.Mod) and isinstance(left, str | bytes):
        raise ValueError("%-formatting (its widths could be anything the program returned)")
    if isinstance(op, ast.Pow):
        _check_pow(left, right)


def _check_call(fn: Value, args: list[Value]) -> None:
    if getattr(fn, "__name__", "") not in _LINEAR_IN_INTS:
        for arg in args:
            _check_int(arg)
    if fn in _COMBINATORIAL and any(isinstance(a, int) and a > _MAX_COMBINATORIAL_ARG for a in args):
        raise ValueError(f"{fn.__name__} of more than {_MAX_COMBINATORIAL_ARG}")  # would stall the event loop
    if getattr(fn, "__name__", "") == "replace" and isinstance(getattr(fn, "__self__", None), str | bytes) and len(args) >= 2:
        if len(fn.__self__) * (len(args[1]) + 1) > MAX_SIZE:
            raise ValueError(f"a replace() that could grow past {MAX_SIZE}")
