"""MBPP-style asserts split into what the program computes and what the verifier judges.

An assert such as ``assert set(add(1, 2)) == {3}`` mixes the solution's inputs (``add(1, 2)``) with the
expected value (``{3}``). Only the first half may enter the sandbox: a program that can see the expected
value can answer from it, and a program that runs the comparison can make it lie (``__eq__`` always
true, a patched ``set``, ``os._exit(0)`` before the assert). So each assert is split:

* **probes**: the smallest sub-expressions that call the solution: a call chain (``f(x)``,
  ``Solver().run(x)``, ``f(x)[0]``) rooted at a name the test does not own. A materializing builtin such
  as ``set(...)`` or ``sorted(...)`` whose every argument is a probe joins it, so a solution may return
  an iterator. Probes are the only test text the program sees; ``code_harness`` evaluates them there
  and sends back their values, rebuilt here from built-in types only;
* **checks**: the rest of the assert, each probe replaced by a name ``_probe_<k>``, evaluated here by
  ``code_judge`` over those plain values. A form it cannot evaluate raises ``PluginError`` naming it,
  so the sample is FAILED rather than scored.

Names the test owns, never the solution's even if it defines or fakes them: every Python builtin,
``math``/``cmath``/``sys``/``string``, any standard-library module used as ``module.attr`` (so
``re.match("a", f(1))`` is refused rather than handed, pattern and all, to a program that may have
replaced ``re``), and what the case's setup imports bind. A name the test neither owns nor calls
(``assert f(1) == EXPECTED``, a bare ``inf``) is refused: the program would supply its value.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from slime.errors import PluginError
from slime.rollout.verifiers.code_bounds import Value
from slime.rollout.verifiers.code_judge import ALL_METHODS, JUDGE_MODULES, judge, validate

__all__ = ["SplitAssert", "CaseSetup", "judge_case", "split_assert", "parse_setup"]

MATERIALIZERS = frozenset(
    {"list", "tuple", "set", "frozenset", "sorted", "dict", "len", "sum", "min", "max", "any", "all"}
)
"""Builtins that join a probe when every positional argument is one: they consume what the solution returns."""
_JUDGE_IMPORTABLE = {"math", "cmath"}
"""Modules whose names a setup import may also give to the checks (``from math import isclose``)."""


@dataclasses.dataclass(frozen=True)
class CaseSetup:
    """A test case's setup imports.

    Attributes:
        lines: the import lines, run in the program after the solution (the probes may use them).
        names: every name they bind (the test's, not the solution's).
        judge_names: the names the checks may read: those bound from ``math``/``cmath`` -> the real object.
    """

    lines: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    judge_names: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SplitAssert:
    """One test case's asserts, split (module docstring).

    Attributes:
        source: the assert text as the dataset gave it (for evidence).
        probes: Python expressions the program evaluates, in order; check names ``_probe_<k>`` index them.
        checks: one expression per ``assert`` statement, true when the case passes.
        judge_names: ``CaseSetup.judge_names`` of the case.
    """

    source: str
    probes: tuple[str, ...]
    checks: tuple[ast.expr, ...]
    judge_names: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def parse_setup(lines: Sequence[str]) -> CaseSetup:
    """The setup of ``lines`` (``import x``, ``from x import y``; MBPP's ``test_imports``).

    Raises:
        PluginError: a line that does not parse or is not an import (MBPP's ``test_setup_code`` that
            defines values is refused: the checks could not see them and the program could fake them).
    """
    names: set[str] = set()
    judge_names: dict[str, Any] = {}
    for line in lines:
        for stmt in _parse(line, "test setup").body:
            if not isinstance(stmt, ast.Import | ast.ImportFrom):
                raise PluginError(f"code verifier: test setup may only import, got {line[:200]!r}")
            bound = _judge_bindings(stmt)
            names.update(
                bound if _is_star(stmt) else ((alias.asname or alias.name).split(".")[0] for alias in stmt.names)
            )
            judge_names.update(bound)
    return CaseSetup(lines=tuple(lines), names=frozenset(names), judge_names=judge_names)


def _parse(text: str, what: str) -> ast.Module:
    """``ast.parse``, with what cannot be parsed (syntax, nesting past the parser's depth) as PluginError."""
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise PluginError(f"code verifier: {what} {text[:200]!r} does not parse ({exc.msg})") from None
    except (RecursionError, MemoryError, ValueError):  # ValueError: a NUL byte in the source
        raise PluginError(f"code verifier: {what} {text[:200]!r} is nested too deep or holds a NUL byte") from None


def _is_star(stmt: ast.Import | ast.ImportFrom) -> bool:
    """``from m import *``: allowed from ``math``/``cmath`` only, whose names the verifier knows; from any
    other module the names the asserts use could be anyone's (a ``Counter`` call became a probe)."""
    if not (isinstance(stmt, ast.ImportFrom) and any(alias.name == "*" for alias in stmt.names)):
        return False
    if stmt.module not in _JUDGE_IMPORTABLE or stmt.level:
        raise PluginError(f"code verifier: test setup 'from {stmt.module} import *': name what the asserts use")
    return True


def _judge_bindings(stmt: ast.Import | ast.ImportFrom) -> dict[str, object]:
    if isinstance(stmt, ast.ImportFrom) and _is_star(stmt):
        return {k: v for k, v in vars(JUDGE_MODULES[str(stmt.module)]).items() if not k.startswith("_")}
    if isinstance(stmt, ast.Import):
        return {
            alias.asname or alias.name: JUDGE_MODULES[alias.name]
            for alias in stmt.names
            if alias.name in _JUDGE_IMPORTABLE
        }
    if stmt.module not in _JUDGE_IMPORTABLE or stmt.level:
        return {}
    module = JUDGE_MODULES[stmt.module]
    return {
        alias.asname or alias.name: getattr(module, alias.name) for alias in stmt.names if hasattr(module, alias.name)
    }


def split_assert(source: str, setup: CaseSetup | None = None) -> SplitAssert:
    """Split ``source`` (one or more ``assert`` statements) into probes and checks.

    Args:
        source: e.g. ``"assert add(1, 2) == 3"``.
        setup: the case's setup imports (``parse_setup``).

    Raises:
        PluginError: not assert statements, or a form the verifier cannot judge outside the program (named).
    """
    setup = setup or CaseSetup()
    module = _parse(source, "test")
    if not module.body or not all(isinstance(stmt, ast.Assert) for stmt in module.body):
        raise PluginError(f"code verifier: test {source[:200]!r} is not a sequence of assert statements")
    splitter = _Splitter(source, setup.names | _TEST_NAMES)
    try:
        checks = tuple(splitter.split(stmt.test) for stmt in module.body if isinstance(stmt, ast.Assert))
        judge_names = {**splitter.math_wrappers, **setup.judge_names}
        for check in checks:
            validate(check, source, judge_names)
    except RecursionError:
        raise PluginError(f"code verifier: test {source[:200]!r} is nested too deep") from None
    if not splitter.probes:  # a case that never calls the solution would pass every program
        raise PluginError(f"code verifier: test {source[:200]!r} calls nothing of the solution")
    return SplitAssert(source=source, probes=tuple(splitter.probes), checks=checks, judge_names=judge_names)


def judge_case(case: SplitAssert, outcomes: Sequence[tuple[bool, Value]]) -> tuple[bool, str]:
    """Judge ``case`` over its probes' outcomes from the harness (``code_judge.judge``)."""
    return judge(case.checks, case.probes, outcomes, case.source, case.judge_names)


_TEST_NAMES = frozenset(dir(builtins)) | frozenset(JUDGE_MODULES)


class _Splitter:
    """Collects probes while rewriting an assert's test expression into a check."""

    def __init__(self, source: str, test_names: frozenset[str]):
        self.source, self.test_names = source, test_names
        self.probes: list[str] = []
        self.math_wrappers: dict[str, Any] = {}
        """``math`` names called around a solution call without an import (``isclose(area(2), 12.566)``):
        the test's, so the judge gives the real function (the program could define its own)."""

    def split(self, node: ast.expr) -> ast.expr:
        if self._is_probe(node):
            return self._probe(node)
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                setattr(node, field, self.split(value))
            elif isinstance(value, list):
                setattr(node, field, [self.split(v) if isinstance(v, ast.expr) else self._keyword(v) for v in value])
        return node

    def _keyword(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.keyword):
            node.value = self.split(node.value)
        return node

    def _probe(self, node: ast.expr) -> ast.expr:
        self.probes.append(ast.unparse(node))
        return ast.copy_location(ast.Name(id=f"_probe_{len(self.probes) - 1}", ctx=ast.Load()), node)

    def _is_probe(self, node: ast.expr) -> bool:
        if _is_builtin_method(node):  # greet('Bob').startswith('Hello'): the argument is the expected value
            return False
        root, above, calls = node, node, False
        while isinstance(root, ast.Call | ast.Attribute | ast.Subscript):
            calls = calls or isinstance(root, ast.Call)
            above, root = root, root.func if isinstance(root, ast.Call) else root.value
        # re.match('a', f(1)): a standard module's attribute is the test's, or the program could fake the module
        stdlib = isinstance(above, ast.Attribute) and isinstance(root, ast.Name) and root.id in sys.stdlib_module_names
        if calls and isinstance(root, ast.Name) and root.id not in self.test_names and not stdlib:
            return not self._is_math_wrapper(node, root.id)
        return self._is_materialized(node)

    def _is_materialized(self, node: ast.expr) -> bool:
        """set(f(x)), sorted(f(x), reverse=True): the builtin consumes the program's value, so it runs beside
        it; ``max(f(x), default=7)`` keeps the builtin in the check (its default may be the expected value)."""
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in MATERIALIZERS
            and bool(node.args)
            and all(_is_plain_keyword(k) for k in node.keywords)
            and all(self._is_probe(arg) for arg in node.args)
        )

    def _is_math_wrapper(self, node: ast.expr, name: str) -> bool:
        """``isclose(area(2), 12.566)`` with no import: ``name`` is math's around the solution's call."""
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and hasattr(JUDGE_MODULES["math"], name)
        ):
            return False
        inner = [
            sub
            for arg in [*node.args, *(k.value for k in node.keywords)]
            for sub in ast.walk(arg)
            if isinstance(sub, ast.Call)
        ]
        if not any(self._is_probe(sub) for sub in inner):
            return False
        self.math_wrappers[name] = getattr(JUDGE_MODULES["math"], name)
        return True


def _is_builtin_method(node: ast.expr) -> bool:
    """A call of (or reference to) a method the judge applies to built-in values (``code_judge.METHODS``)."""
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr in ALL_METHODS


def _is_plain_keyword(keyword: ast.keyword) -> bool:
    """Not ``default=``: the value a materializer returns for an empty input is often the expected one."""
    return keyword.arg != "default"
