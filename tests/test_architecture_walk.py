"""docs/ARCHITECTURE.md's walk of one sample names real code: every ``slime/...py:name`` hop (``name`` a
function or class of that file, ``Class.method`` a method of it) exists, so a rename that forgets the
walk fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOP = re.compile(r"`(slime/[\w/]+\.py):([\w.]+)`")


def walk_section() -> str:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    start = text.index("### The walk of one sample")
    return text[start : text.index("\n## ", start)]


def defined_names(path: Path) -> set[str]:
    """``f``, ``C`` and ``C.m`` for every function, class and method of ``path``."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}.{m.name}" for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return names


def test_every_hop_of_the_walk_names_code_that_exists():
    hops = HOP.findall(walk_section())
    assert len(hops) >= 15, "the walk lost its hops"
    missing = [
        f"{file}:{name}" for file, name in hops if not (ROOT / file).exists() or name not in defined_names(ROOT / file)
    ]
    assert not missing, f"docs/ARCHITECTURE.md's walk names what is not there: {missing}"
