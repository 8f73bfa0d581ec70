"""The import layering of ``slime`` (docs/ARCHITECTURE.md, "Where things live"): which part may import which, and no cycles.

Every ``import``/``from ... import`` of ``slime`` in the package is read with ``ast``, those inside
functions included (a lazy import still runs). Imports under ``if TYPE_CHECKING:`` are left out: they
never run, so they can neither break layering at run time nor close a cycle. Each module belongs to
the longest matching ``PARTS`` prefix; ``MAY_IMPORT`` lists, per part, the parts it may import (its
own always). A new arrow that is not listed, or a cycle between modules, fails with its file and line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BASE = {"types", "errors", "core"}
"""The leaves everyone may import: the core types, the errors, the config and small helpers."""
PARTS = {
    "slime": "root",  # the package's empty __init__ (matched exactly, not as a prefix)
    "slime.types": "types",
    "slime.errors": "errors",
    **{
        f"slime.{m}": "core"
        for m in ("config", "yaml_file", "hf_checkpoint", "hf_compat", "hf_config_defaults", "eval_config", "stop")
    },
    "slime.train_metrics": "core",  # the trainer's metrics struct: written by train, recorded by loop, read by obs
    "slime.step_record": "core",  # the metrics.jsonl step records: written by loop, decoded by obs and bench
    "slime.routed_experts": "core",  # MoE routes on a Sample: parsed by protocol, merged by rollout, packed by train
    "slime.obs": "obs",
    "slime.sync": "sync",
    "slime.data": "data",
    "slime.train": "train",
    "slime.servers": "servers",
    "slime.engines.protocol": "protocol",
    "slime.engines": "engines",
    "slime.engines.fleet": "fleet",
    "slime.rollout": "rollout",
    "slime.rollout.plugin_check": "plugin_check",
    "slime.rollout.plugin_contracts": "plugin_check",  # the checks `slime check-plugin` runs
    "slime.loop": "loop",
    "slime.bench": "bench",
    "slime.cli": "cli",  # the slime/cli/ package: the entry, the flags, the compat table, preflight
    "slime.cluster": "cluster",  # a run's processes placed and supervised on Ray (issue 28; docs/ray.md)
}
MAY_IMPORT = {
    "root": set(),
    "types": set(),
    "errors": set(),
    "core": {"errors", "types"},
    "obs": BASE,
    "sync": BASE,
    "data": BASE,
    "train": BASE | {"sync"},  # sync.hf_layout: the HF names of fused MoE experts
    "protocol": BASE,  # the SGLang wire structs, shared by the client and the servers
    "servers": BASE | {"sync", "protocol"},  # the far side of the wire: never the client, the loop or the trainer
    "engines": BASE | {"protocol"},
    "fleet": BASE | {"protocol", "engines"},
    "rollout": BASE | {"data", "protocol", "engines", "fleet"},  # one sample's life; never train
    "plugin_check": BASE
    | {"data", "protocol", "engines", "rollout", "servers"},  # `slime check-plugin` starts an engine
    "loop": BASE | {"obs", "sync", "data", "train", "protocol", "engines", "fleet", "rollout"},
    "bench": BASE | {"obs", "sync", "data", "train", "protocol", "engines", "fleet", "rollout", "servers", "loop"},
    # fleet: the launch plan's commands and lifeline (a process dies with its actor); loop.resume: the last
    # checkpoint named when a trainer rank dies
    "cluster": BASE | {"fleet", "loop"},
    "cli": set(PARTS.values()),
}
KNOWN: dict[tuple[str, str], str] = {}
"""Arrows that break the rules today, each with why; the test fails if one disappears (drop it here)."""


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str], root: Path = ROOT) -> list[tuple[int, str]]:
    """``(line, module)`` of every run-time import of a ``slime`` module in ``path`` (TYPE_CHECKING blocks skipped).

    ``from a.b import c`` names ``a.b.c`` when that is a module, else ``a.b``; relative imports are resolved.
    """
    tree = ast.parse(path.read_text(), str(path))
    skip = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    me = module_name(path, root)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "slime"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            if base.split(".")[0] != "slime":
                continue
            for a in node.names:
                found.append((node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base))
    return found


def part_of(module: str) -> str:
    keys = [k for k in PARTS if module == k or (k != "slime" and module.startswith(k + "."))]
    if not keys:
        raise AssertionError(f"{module} belongs to no part of tests/test_layering.py's PARTS: add it there")
    return PARTS[max(keys, key=len)]


def import_graph(root: Path = ROOT) -> dict[str, list[tuple[int, str]]]:
    """Module -> its run-time ``slime`` imports, for every module under ``root/slime``."""
    paths = {module_name(p, root): p for p in sorted((root / "slime").rglob("*.py"))}
    return {m: imports(p, set(paths), root) for m, p in paths.items()}


def back_arrows(graph: dict[str, list[tuple[int, str]]]) -> list[str]:
    bad = []
    for module, deps in graph.items():
        for line, dep in deps:
            src, dst = part_of(module), part_of(dep)
            if src != dst and dst not in MAY_IMPORT[src] and (module, dep) not in KNOWN:
                bad.append(f"{module}:{line} imports {dep} ({src} may not import {dst})")
    return bad


def cycles(graph: dict[str, list[tuple[int, str]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), leaving out ``KNOWN`` arrows."""
    edges = {
        m: sorted({d for _, d in deps if d in graph and d != m and (m, d) not in KNOWN}) for m, deps in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                found.append(sorted([v, *comp]))

    for v in edges:
        if v not in index:
            visit(v)
    return found


GRAPH = import_graph()


def test_every_module_belongs_to_a_part_with_rules():
    assert set(MAY_IMPORT) == set(PARTS.values())
    for module in GRAPH:
        assert part_of(module) in MAY_IMPORT


def test_no_import_runs_against_the_layering():
    bad = back_arrows(GRAPH)
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_modules():
    found = cycles(GRAPH)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


DOCUMENTED = sorted(
    {
        m.group(1)
        for f in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "scripts").rglob("*.sh")]
        if f.name != "benchmarks.md"
        for m in re.finditer(r"--[a-z-]+-path[ =]+[`'\"]?(slime\.[A-Za-z0-9_.:]+)", f.read_text())
    }
)


def test_the_documented_plugin_paths_are_found():
    assert "slime.rollout.multiturn.calculator_generate" in DOCUMENTED


@pytest.mark.parametrize("path", DOCUMENTED)
def test_every_documented_plugin_path_into_slime_still_resolves(path):
    """A dotted path users pass (``--custom-generate-function-path slime.rollout...``) keeps working after a
    move; THUDM/slime's own rollout paths are names the driver recognises, not modules here."""
    from slime.config.rollout import BUILTIN_ROLLOUTS
    from slime.rollout.rewards import load_function

    if path not in BUILTIN_ROLLOUTS:
        assert callable(load_function(path))


@pytest.mark.parametrize("pair", sorted(KNOWN))
def test_each_known_exception_still_exists(pair):
    module, dep = pair
    assert dep in {d for _, d in GRAPH[module]}, f"{module} no longer imports {dep}: remove it from KNOWN"


@pytest.mark.parametrize(
    "rule",
    [
        ("rollout", "train"),
        ("train", "rollout"),
        ("servers", "loop"),
        ("servers", "engines"),
        ("engines", "rollout"),
        ("loop", "servers"),
        ("loop", "cli"),
        ("bench", "cli"),
    ],
)
def test_the_stated_rules_hold(rule):
    """What docs/ARCHITECTURE.md says in words: rollout and train never import each other, servers never
    import the loop or the client, nothing imports back up into the CLI."""
    src, dst = rule
    assert dst not in MAY_IMPORT[src]


def test_a_new_back_arrow_or_cycle_is_caught(tmp_path):
    """The checks on a copy of the package with two added imports: train -> rollout, and a cycle."""
    import shutil

    shutil.copytree(ROOT / "slime", tmp_path / "slime")
    (tmp_path / "slime" / "train" / "kl.py").write_text(
        (ROOT / "slime" / "train" / "kl.py").read_text() + "\nfrom slime.rollout.generate import request_id\n"
    )
    (tmp_path / "slime" / "engines" / "breaker.py").write_text(
        (ROOT / "slime" / "engines" / "breaker.py").read_text() + "\ndef _late():\n    from slime.engines import pool\n"
    )
    graph = import_graph(tmp_path)
    assert [b for b in back_arrows(graph) if b.startswith("slime.train.kl:")] == [
        f"slime.train.kl:{len((ROOT / 'slime/train/kl.py').read_text().splitlines()) + 2} imports slime.rollout.generate"
        " (train may not import rollout)"
    ]
    assert any({"slime.engines.breaker", "slime.engines.pool"} <= set(c) for c in cycles(graph))


def test_type_checking_imports_do_not_count(tmp_path):
    f = tmp_path / "slime" / "m.py"
    f.parent.mkdir()
    f.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from slime.loop import driver\nimport slime.errors\n"
    )
    assert imports(f, set(), tmp_path) == [(4, "slime.errors")]
