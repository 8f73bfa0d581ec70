"""MBPP-style asserts split into what the program computes and what the verifier judges.

An assert such as ``assert set(add(1, 2)) == {3}`` mixes the solution's inputs (``add(1, 2)``) with the
expected value (``{3}``). Only the first half may enter the sandbox: a program that can see the expected
value can answer from it, and a program that runs the comparison can make it lie (``__eq__`` always
true, a patched ``set``, ``os._exit(0)`` before the assert). So each assert is split:

* **probes**: the smallest sub-expressions that name the solution (a call, attribute or subscript rooted
  at a name the test does not bind, e.g. ``add(1, 2)``; a materializing builtin such as ``set(...)`` or
  ``sorted(...)`` whose every argument is a probe joins it, so a solution may return an iterator). They
  are the only test text the program sees; ``code_harness`` evaluates them there and sends back their
  values, rebuilt here from built-in types only;
* **checks**: the rest of the assert, with each probe replaced by a name ``_probe_<k>``. ``judge``
  evaluates them here, in the verifier's process, over those plain values: a small evaluator over a
  fixed set of expression forms (literals, comparisons, boolean and arithmetic operators, subscripts,
  and calls of pure builtins and ``math``/``cmath`` functions). An assert outside those forms raises
  ``PluginError`` naming it, so the sample is FAILED rather than scored.

Names the test binds: Python's builtins, ``math`` and ``cmath`` (never the solution's, even if it
defines or fakes them), what the test case's ``setup`` imports bind (used inside probes only), and any
standard-library module used as ``module.attr`` (so ``re.match("a", f(1))`` is refused rather than handed,
pattern and all, to a program that may have replaced ``re``).
"""

from __future__ import annotations

import ast
import builtins
import cmath
import dataclasses
import math
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

from slime.errors import PluginError

__all__ = ["SplitAssert", "judge", "setup_names", "split_assert"]

JUDGE_MODULES: dict[str, Any] = {"math": math, "cmath": cmath}
"""Modules the checks may call into (attributes only, no dunders); always the real ones."""
JUDGE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    name: getattr(builtins, name)
    for name in (
        "abs", "all", "any", "bool", "complex", "dict", "divmod", "float", "frozenset", "int", "isinstance", "len",
        "list", "max", "min", "repr", "reversed", "round", "set", "sorted", "str", "sum", "tuple", "bytes", "type",
    )
}  # fmt: skip
"""Builtins the checks may call: pure functions of built-in values (and the types for ``isinstance``)."""
MATERIALIZERS = frozenset({"list", "tuple", "set", "frozenset", "sorted", "dict", "len", "sum", "min", "max", "any", "all"})
"""Builtins that join a probe when every argument is one: they consume what the solution returns."""
_MAX_REPEAT = 1 << 20
"""Largest ``sequence * int`` the evaluator builds (a returned count must not exhaust our memory)."""

_COMBINATORIAL = (math.factorial, math.comb, math.perm)
_MAX_COMBINATORIAL_ARG = 100_000

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert,
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SplitAssert:
    """One test case's asserts, split (module docstring).

    Attributes:
        source: the assert text as the dataset gave it (for evidence).
        probes: Python expressions the program evaluates, in order; check names ``_probe_<k>`` index them.
        checks: one expression per ``assert`` statement, true when the case passes.
    """

    source: str
    probes: tuple[str, ...]
    checks: tuple[ast.expr, ...]


def setup_names(setup: Sequence[str]) -> frozenset[str]:
    """Names bound by a test case's setup lines (``import x``, ``from x import y``; nothing else is allowed).

    Raises:
        PluginError: a setup line that does not parse or is not an import.
    """
    names: set[str] = set()
    for line in setup:
        try:
            module = ast.parse(line)
        except SyntaxError as exc:
            raise PluginError(f"code verifier: test setup {line!r} does not parse ({exc.msg})") from None
        for stmt in module.body:
            if not isinstance(stmt, ast.Import | ast.ImportFrom):
                raise PluginError(f"code verifier: test setup may only import, got {line!r}")
            names.update((alias.asname or alias.name).split(".")[0] for alias in stmt.names)
    return frozenset(names)


def split_assert(source: str, test_names: frozenset[str] = frozenset()) -> SplitAssert:
    """Split ``source`` (one or more ``assert`` statements) into probes and checks.

    Args:
        source: e.g. ``"assert add(1, 2) == 3"``.
        test_names: names the case's setup binds (``setup_names``), besides builtins and ``math``/``cmath``.

    Raises:
        PluginError: not assert statements, or a form the verifier cannot judge outside the program (named).
    """
    try:
        module = ast.parse(source)
    except SyntaxError as exc:
        raise PluginError(f"code verifier: test {source[:200]!r} does not parse ({exc.msg})") from None
    if not module.body or not all(isinstance(stmt, ast.Assert) for stmt in module.body):
        raise PluginError(f"code verifier: test {source[:200]!r} is not a sequence of assert statements")
    splitter = _Splitter(source, test_names | frozenset(JUDGE_FUNCTIONS) | frozenset(JUDGE_MODULES) | _CONSTANTS)
    checks = tuple(splitter.split(stmt.test) for stmt in module.body if isinstance(stmt, ast.Assert))
    for check in checks:
        _Judge(source, {}).validate(check)
    return SplitAssert(source=source, probes=tuple(splitter.probes), checks=checks)


def judge(case: SplitAssert, values: Sequence[Any]) -> tuple[bool, str]:
    """Evaluate ``case.checks`` over the probes' ``values`` (built-in values, in ``case.probes`` order).

    Returns:
        (passed, why): why names the first failing assert and the values the program returned.
    """
    env = {f"_probe_{k}": v for k, v in enumerate(values)}
    evaluator = _Judge(case.source, env)
    for check in case.checks:
        try:
            ok = bool(evaluator.eval(check))
        except Exception as exc:  # the program's values made the check raise (e.g. len() of an int)
            return False, f"{_shown(case, values)}: the check raised {type(exc).__name__}: {str(exc)[:200]}"
        if not ok:
            return False, f"{_shown(case, values)}: assertion failed"
    return True, "ok"


def _shown(case: SplitAssert, values: Sequence[Any]) -> str:
    got = ", ".join(f"{probe} returned {value!r:.120}" for probe, value in zip(case.probes, values))
    return f"{case.source[:200]!r}" + (f" ({got})" if got else "")


_CONSTANTS = frozenset({"True", "False", "None"})


class _Splitter:
    """Collects probes while rewriting an assert's test expression into a check."""

    def __init__(self, source: str, test_names: frozenset[str]):
        self.source, self.test_names = source, test_names
        self.probes: list[str] = []

    def split(self, node: ast.expr) -> ast.expr:
        if self._is_probe(node):
            return self._probe(node)
        if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp | ast.NamedExpr):
            raise PluginError(f"code verifier: test {self.source[:200]!r} uses {type(node).__name__}, which the verifier cannot judge")
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                setattr(node, field, self.split(value))
            elif isinstance(value, list):
                setattr(node, field, [self.split(v) if isinstance(v, ast.expr) else self._keyword(v) for v in value])
        return node

    def _keyword(self, node: Any) -> Any:
        if isinstance(node, ast.keyword):
            node.value = self.split(node.value)
        return node

    def _probe(self, node: ast.expr) -> ast.expr:
        self.probes.append(ast.unparse(node))
        return ast.copy_location(ast.Name(id=f"_probe_{len(self.probes) - 1}", ctx=ast.Load()), node)

    def _is_probe(self, node: ast.expr) -> bool:
        root, above = node, node
        while isinstance(root, ast.Call | ast.Attribute | ast.Subscript):
            above, root = root, root.func if isinstance(root, ast.Call) else root.value
        # re.match('a', f(1)): a standard module's attribute is the test's, or the program could fake the module
        stdlib_attribute = isinstance(above, ast.Attribute) and isinstance(root, ast.Name) and root.id in sys.stdlib_module_names
        if isinstance(root, ast.Name) and root.id not in self.test_names and not stdlib_attribute:
            return True
        # set(f(x)), sorted(f(x)): the builtin consumes the program's value, so it runs beside it
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in MATERIALIZERS
            and bool(node.args)
            and not node.keywords
            and all(self._is_probe(arg) for arg in node.args)
        )


class _Judge:
    """Evaluates a check over plain values; ``validate`` refuses forms it would not evaluate."""

    def __init__(self, source: str, env: dict[str, Any]):
        self.source, self.env = source, env

    def validate(self, node: ast.AST) -> None:
        for sub in ast.walk(node):
            allowed = isinstance(sub, _NODES) or isinstance(sub, ast.cmpop | ast.operator | ast.unaryop | ast.boolop)
            if not allowed or (isinstance(sub, ast.BinOp) and type(sub.op) not in _BINARY):
                raise PluginError(f"code verifier: test {self.source[:200]!r} uses {type(sub).__name__}, which the verifier cannot judge")
            if isinstance(sub, ast.Attribute) and not (
                isinstance(sub.value, ast.Name) and sub.value.id in JUDGE_MODULES and not sub.attr.startswith("_")
            ):
                raise PluginError(f"code verifier: test {self.source[:200]!r}: only math/cmath attributes can be judged")
            if isinstance(sub, ast.keyword) and sub.arg is None:
                raise PluginError(f"code verifier: test {self.source[:200]!r}: ** arguments cannot be judged")
            if isinstance(sub, ast.Name) and not (
                sub.id in JUDGE_FUNCTIONS or sub.id in JUDGE_MODULES or sub.id in _CONSTANTS or sub.id.startswith("_probe_")
            ):
                raise PluginError(
                    f"code verifier: test {self.source[:200]!r}: {sub.id!r} is neither the solution's nor a builtin the verifier calls"
                )

    def eval(self, node: ast.expr) -> Any:
        method: Callable[[Any], Any] = getattr(self, f"_eval_{type(node).__name__}")
        return method(node)

    def _eval_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def _eval_Name(self, node: ast.Name) -> Any:
        if node.id in self.env:
            return self.env[node.id]
        if node.id in _CONSTANTS:
            return {"True": True, "False": False, "None": None}[node.id]
        return JUDGE_FUNCTIONS.get(node.id) or JUDGE_MODULES[node.id]

    def _eval_Attribute(self, node: ast.Attribute) -> Any:
        return getattr(self.eval(node.value), node.attr)

    def _eval_List(self, node: ast.List) -> Any:
        return [self.eval(e) for e in node.elts]

    def _eval_Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.eval(e) for e in node.elts)

    def _eval_Set(self, node: ast.Set) -> Any:
        return {self.eval(e) for e in node.elts}

    def _eval_Dict(self, node: ast.Dict) -> Any:
        if any(k is None for k in node.keys):
            raise PluginError(f"code verifier: test {self.source[:200]!r}: ** in a dict display cannot be judged")
        return {self.eval(k): self.eval(v) for k, v in zip(node.keys, node.values) if k is not None}

    def _eval_UnaryOp(self, node: ast.UnaryOp) -> Any:
        return _UNARY[type(node.op)](self.eval(node.operand))

    def _eval_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.eval(node.left), self.eval(node.right)
        if isinstance(node.op, ast.Mult) and _too_long(left, right):
            raise ValueError(f"a repetition longer than {_MAX_REPEAT}")
        if isinstance(node.op, ast.Pow) and isinstance(right, int) and abs(right) > 4096:
            raise ValueError(f"an exponent of {right}")
        return _BINARY[type(node.op)](left, right)

    def _eval_BoolOp(self, node: ast.BoolOp) -> Any:
        value: Any = None
        for operand in node.values:
            value = self.eval(operand)
            if bool(value) != isinstance(node.op, ast.And):  # short-circuit as Python does
                return value
        return value

    def _eval_Compare(self, node: ast.Compare) -> Any:
        left = self.eval(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = self.eval(comparator)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _eval_IfExp(self, node: ast.IfExp) -> Any:
        return self.eval(node.body) if self.eval(node.test) else self.eval(node.orelse)

    def _eval_Subscript(self, node: ast.Subscript) -> Any:
        return self.eval(node.value)[self.eval(node.slice)]

    def _eval_Slice(self, node: ast.Slice) -> Any:
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else self.eval(p) for p in parts))

    def _eval_Call(self, node: ast.Call) -> Any:
        fn = self.eval(node.func)
        args = [self.eval(a) for a in node.args]
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg is not None}
        if fn in _COMBINATORIAL and any(isinstance(a, int) and a > _MAX_COMBINATORIAL_ARG for a in args):
            raise ValueError(f"{fn.__name__} of more than {_MAX_COMBINATORIAL_ARG}")  # would stall this process
        return fn(*args, **kwargs)


_NODES = (
    ast.Constant, ast.Name, ast.Load, ast.Attribute, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp,
    ast.BoolOp, ast.Compare, ast.IfExp, ast.Subscript, ast.Slice, ast.Call, ast.keyword,
)  # fmt: skip


def _too_long(left: Any, right: Any) -> bool:
    for seq, count in ((left, right), (right, left)):
        if isinstance(seq, str | bytes | list | tuple) and isinstance(count, int) and len(seq) * count > _MAX_REPEAT:
            return True
    return False
