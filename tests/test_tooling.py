"""CI's static checks (docs/ARCHITECTURE.md, "Tooling"): ``ruff check`` and ``ruff format --check`` over
slime/, tests/ and scripts/, and mypy over the package, each with the configuration in pyproject.toml. Both tools come with the
``test`` extra (scripts/setup.sh); where one is not installed its test is skipped, naming the tool.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(module: str) -> list[str]:
    """``python -m <module>`` from this interpreter's environment, or skip naming the missing tool."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]', or bash scripts/setup.sh)")
    return [sys.executable, "-m", module]


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_ruff_check_is_clean():
    out = _run([*_tool("ruff"), "check", "--no-cache", "slime", "tests", "scripts"], timeout_s=60)
    assert out.returncode == 0, (
        f"ruff check found problems (fix them, or `# noqa: CODE  # why`):\n{out.stdout}{out.stderr}"
    )


def test_code_is_ruff_formatted():
    """``ruff format --check``: the tree is as ``ruff format slime tests scripts`` leaves it (line length 140)."""
    out = _run([*_tool("ruff"), "format", "--check", "--no-cache", "slime", "tests", "scripts"], timeout_s=60)
    assert out.returncode == 0, f"not formatted (run `ruff format slime tests scripts`):\n{out.stdout}{out.stderr}"


def test_mypy_is_clean_on_the_package():
    """mypy with pyproject.toml's [tool.mypy] (files = slime). Its incremental cache lives in .mypy_cache,
    so a re-run only re-checks what changed."""
    out = _run([*_tool("mypy"), "--no-error-summary", "--hide-error-context"], timeout_s=300)
    assert out.returncode == 0, f"mypy found type errors:\n{out.stdout}{out.stderr}"


def test_no_module_of_the_package_is_exempt_from_mypy():
    """Every module is type-checked: no ``ignore_errors`` override in [tool.mypy] (the driver's was lifted)."""
    import tomllib

    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"].get("overrides", [])
    assert [o["module"] for o in overrides if o.get("ignore_errors")] == []


def test_mypy_checks_optional_strictly():
    """Optional is strict: ``strict_optional`` is not turned off, for the package or for any module."""
    import tomllib

    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy.get("strict_optional", True) is True
    assert [o["module"] for o in mypy.get("overrides", []) if o.get("strict_optional") is False] == []
