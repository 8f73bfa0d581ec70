"""Two shape rules of the package (issue 17, docs/ARCHITECTURE.md, "Where things live"): no module over 400 lines, and no
function outside the CLI entry and the run skeletons takes the whole ``Config``: each component gets its
own section(s) or values, and checks that read several sections are methods of ``Config`` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400

WHOLE_CONFIG_ALLOWED = {
    "slime/cli/__init__.py": None,  # the CLI entry: every function (it builds the config and hands out its sections)
    "slime/cli/preflight.py": None,  # the CLI entry's start-of-run checks (``preflight(config)``)
    "slime/cli/args.py": None,  # the flags onto the config (``config_from_args(..., base=Config)``)
    "slime/loop/run.py": None,  # the run skeleton shared by RL and SFT
    "slime/cli/on_ray.py": None,  # the CLI entry's ``--ray`` (the driver's own flags, then slime.cluster.launch)
    "slime/cli/plan_inputs.py": None,  # the CLI entry's input checks of a plan (``check_inputs`` on the paths here)
    "slime/cli/resume_flags.py": None,  # the CLI entry's ``--load``: the saved Config against the flags' one
    "slime/cluster/launch.py": {
        "run_on_ray",
        "dry_run_on_ray",
        "_plan",
    },  # the Ray run's skeleton: it hands out sections
    "slime/loop/driver.py": {"run_training", "_build_parts", "_drive"},  # the RL run on the skeleton, and its two steps
    "slime/loop/sft.py": {
        "run_sft",
        "_read_data",
        "_resumed_trainer",
        "_drive",
    },  # the SFT run on the skeleton, its steps
}
"""File -> the functions in it that may take the whole ``Config`` (None: all of them)."""


def _modules() -> list[Path]:
    return sorted((ROOT / "slime").rglob("*.py"))


def _names_config(annotation: ast.expr | None) -> bool:
    """Whether an annotation mentions the root ``Config`` (``Config``, ``"Config"``, ``Config | None``, ``x.Config``)."""
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Config":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Config":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                if _names_config(ast.parse(node.value, mode="eval").body):
                    return True
            except SyntaxError:
                continue
    return False


def whole_config_parameters(path: Path) -> list[str]:
    """``file:line function(param)`` for each parameter of a function in ``path`` annotated with the root
    ``Config``, or named ``config`` with no annotation (it could be anything, the whole config included)."""
    found = []
    rel = path.relative_to(ROOT).as_posix()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
            if _names_config(arg.annotation) or (arg.arg == "config" and arg.annotation is None):
                found.append(f"{rel}:{node.lineno} {node.name}({arg.arg})")
    return found


def test_no_function_outside_the_cli_and_the_run_skeletons_takes_the_whole_config():
    bad = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        allowed = WHOLE_CONFIG_ALLOWED.get(rel, set())
        for hit in whole_config_parameters(path):
            name = hit.split(" ", 1)[1].split("(", 1)[0]
            if allowed is not None and name not in allowed:
                bad.append(hit)
    assert not bad, (
        "these take the whole Config: pass the section(s) or values they read, or make a check "
        "across sections a method of Config (slime/config/root.py):\n" + "\n".join(bad)
    )


def test_the_rule_catches_a_whole_config_parameter(tmp_path):
    """The scan sees the spellings a whole config comes in: annotated, quoted, optional, unannotated."""
    src = tmp_path / "slime" / "m.py"
    src.parent.mkdir()
    src.write_text(
        "def a(config: Config): ...\ndef b(c: 'Config | None'): ...\nasync def c(*, config): ...\n"
        "def d(train: TrainConfig, config: Any): ...\nclass K:\n    def e(self, x: slime.config.Config): ...\n"
    )
    import tests.test_structure as me

    old, me.ROOT = me.ROOT, tmp_path
    try:
        hits = whole_config_parameters(src)
    finally:
        me.ROOT = old
    assert [h.split(" ", 1)[1] for h in hits] == ["a(config)", "b(c)", "c(config)", "e(x)"]


def test_each_allowed_function_still_exists():
    """The allow-list names real functions (drop an entry when its function goes)."""
    for rel, names in WHOLE_CONFIG_ALLOWED.items():
        tree = ast.parse((ROOT / rel).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert names is None or names <= defined, (rel, names - defined)


LONG_MODULES = {
    "slime/cli/flags.py": "the table of slime train's flags (one entry per flag, no logic): split, it would read worse",
}
"""Modules that may be longer than ``MAX_LINES``, each with the reason it reads better whole."""


def test_no_module_in_the_package_is_over_400_lines_unless_listed_with_its_reason():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _modules()}
    over = {p: n for p, n in sizes.items() if n > MAX_LINES and p not in LONG_MODULES}
    assert sizes and not over, f"split these by responsibility (at most {MAX_LINES} lines each): {over}"
    stale = [p for p in LONG_MODULES if sizes.get(p, 0) <= MAX_LINES]
    assert not stale, f"within the budget now (or gone): drop them from LONG_MODULES: {stale}"
