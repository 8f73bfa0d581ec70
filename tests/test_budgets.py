"""Size and typing budgets of the package (issue 27; docs/ARCHITECTURE.md, "Where things live").

Budgets, not cliffs: a function over ``FUNCTION_BUDGET`` lines must be on ``LONG_FUNCTIONS`` with the
reason it reads better whole (a table, an argument parser), and an entry whose function shrank or went
fails too, so the list never rots. Classes are composed, not spread over files: no ``*Mixin`` base, no
``if TYPE_CHECKING:`` block of stubs inside a class body, no class working on attributes it declares
but never sets. ``Any`` in signatures is held under
``ANY_BUDGET`` (631 when the budget was set, 2026-12-03; the rest are third-party objects, JSON through
``slime.types.JsonObject``, or the verifier's dynamic ``code_bounds.Value``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUNCTION_BUDGET = 60
"""Lines of a function or method, decorators and docstring included."""
LONG_FUNCTIONS = {
    "slime/bench/rollout.py:build_parser": "an argparse table: one add_argument per flag, read top to bottom",
}
"""``file:function`` -> why it may be longer than ``FUNCTION_BUDGET``."""
ANY_BUDGET = 160
"""Most ``Any`` annotations in the package's function signatures (parameters and returns)."""


def _trees() -> list[tuple[str, ast.Module]]:
    return [
        (p.relative_to(ROOT).as_posix(), ast.parse(p.read_text(), str(p)))
        for p in sorted((ROOT / "slime").rglob("*.py"))
    ]


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _length(node: ast.AST) -> int:
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])  # type: ignore[attr-defined]
    return node.end_lineno - start + 1  # type: ignore[attr-defined, operator]


def long_functions(trees: list[tuple[str, ast.Module]]) -> dict[str, int]:
    """``file:function`` -> lines, for every function over ``FUNCTION_BUDGET``."""
    return {
        f"{rel}:{fn.name}": _length(fn)
        for rel, tree in trees
        for fn in _functions(tree)
        if _length(fn) > FUNCTION_BUDGET
    }


def any_annotations(trees: list[tuple[str, ast.Module]]) -> int:
    """How many parameter and return annotations of the package's functions mention ``Any``."""

    def mentions_any(annotation: ast.expr | None) -> bool:
        return annotation is not None and any(
            (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
            for n in ast.walk(annotation)
        )

    count = 0
    for _, tree in trees:
        for fn in _functions(tree):
            a = fn.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x is not None)]
            count += sum(mentions_any(p.annotation) for p in params) + mentions_any(fn.returns)
    return count


_DECLARATIVE = ("Protocol", "Struct", "TypedDict", "dataclass", "NamedTuple", "Exception", "Error", "Enum")
"""Bases or decorators of classes whose bare annotations are their fields, not another class's attributes."""


def mixin_classes(trees: list[tuple[str, ast.Module]]) -> list[str]:
    """Classes with a ``*Mixin`` base, a ``TYPE_CHECKING`` block in their body (stubs of another class's
    members), or attributes they declare but never set (no ``__init__``, not a struct-like class): the
    shape of a mixin that works on its host's state."""
    found = []
    for rel, tree in trees:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            bases = [ast.unparse(b) for b in cls.bases]
            stubs = any(isinstance(s, ast.If) and "TYPE_CHECKING" in ast.unparse(s.test) for s in cls.body)
            declared = any(isinstance(s, ast.AnnAssign) and s.value is None for s in cls.body)
            has_init = any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in cls.body)
            kinds = " ".join(bases + [ast.unparse(d) for d in cls.decorator_list])
            borrowed = declared and not has_init and not any(k in kinds for k in _DECLARATIVE)
            if stubs or borrowed or any(b.endswith("Mixin") for b in bases):
                found.append(f"{rel}:{cls.lineno} {cls.name}({', '.join(bases)})")
    return found


def test_no_function_is_over_the_budget_unless_listed_with_its_reason():
    over = long_functions(_trees())
    unlisted = {name: n for name, n in over.items() if name not in LONG_FUNCTIONS}
    assert not unlisted, f"over {FUNCTION_BUDGET} lines: split into named steps, or list it with its reason: {unlisted}"


def test_each_listed_long_function_is_still_long():
    over = long_functions(_trees())
    stale = sorted(set(LONG_FUNCTIONS) - set(over))
    assert not stale, f"these are within the budget now (or gone): drop them from LONG_FUNCTIONS: {stale}"


def test_any_in_signatures_stays_within_its_budget():
    assert any_annotations(_trees()) <= ANY_BUDGET


def test_no_class_is_spread_over_files_as_mixins():
    assert not mixin_classes(_trees())


def test_the_scans_see_what_they_claim(tmp_path):
    """The rules catch a long function, an ``Any`` parameter and return, and both mixin forms."""
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_BUDGET))
    src = (
        f"def long():\n{body}\n"
        "def typed(a: Any, *b: list[Any]) -> 'Any': ...\n"
        "class A(PoolMixin): ...\n"
        "class B:\n    if TYPE_CHECKING:\n        def _x(self) -> int: ...\n"
        "class C:\n    config: LoopConfig\n    def quota(self) -> int: ...\n"
        "class D(msgspec.Struct):\n    n: int\n"
        "class E:\n    n: int\n    def __init__(self) -> None: ...\n"
    )
    trees = [("slime/m.py", ast.parse(src))]
    assert long_functions(trees) == {"slime/m.py:long": FUNCTION_BUDGET + 1}
    assert any_annotations(trees) == 2  # a string annotation is not parsed: only the two real ones count
    assert [m.split(" ")[1] for m in mixin_classes(trees)] == ["A(PoolMixin)", "B()", "C()"]
