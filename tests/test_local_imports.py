"""No function imports a name that its module also binds at top level.

Such an import makes the name local to the whole function, so a use on a path that did not run the
import raises ``UnboundLocalError`` instead of using the module's name (issue 14: a ``ConfigError``
imported inside one branch of ``run_training`` broke the error raised in another). Names bound only
under ``if TYPE_CHECKING:`` do not count: they do not exist at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("slime", "scripts", "tests")


def _bound(node: ast.stmt) -> set[str]:
    """Names a top-level statement binds (imports bind their first dotted part, ``import a.b`` binds ``a``)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, (ast.AnnAssign, ast.AugAssign))
        else []
    )
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _module_names(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                names |= _module_names(node.body) | _module_names(node.orelse)
        elif isinstance(node, ast.Try):
            names |= _module_names(
                node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
            )
        elif isinstance(node, ast.With):
            names |= _module_names(node.body)
        else:
            names |= _bound(node)
    return names


def shadowing_imports(source: str) -> list[tuple[int, str, str]]:
    """``(line, function, name)`` of each import in a function that binds a module-level name."""
    tree = ast.parse(source)
    module = _module_names(tree.body)
    found = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found |= {(node.lineno, fn.name, name) for name in _bound(node) & module}
    return sorted(found)


def test_the_checker_finds_an_import_that_shadows_a_module_name():
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\nfrom errors import ConfigError\n"
        "def f(x):\n    if x:\n        from errors import ConfigError\n    import torch\n    import torch.nn as nn\n"
        "    raise ConfigError('x')\n"
    )
    assert shadowing_imports(source) == [(7, "f", "ConfigError")]


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_function_import_shadows_a_module_level_name(folder):
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {fn}() imports {name!r}, which the module already binds"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, fn, name in shadowing_imports(path.read_text())
    ]
    assert not bad, "\n".join(bad)
