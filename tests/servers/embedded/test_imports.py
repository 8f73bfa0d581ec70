"""slime/servers/embedded/: the route modules read the server through ``ServerState`` (state.py), so no
module imports ``server.py`` back, not even under ``TYPE_CHECKING`` (tests/test_layering.py skips those)."""

import ast
from pathlib import Path

import slime.servers.embedded as embedded

PACKAGE = Path(embedded.__file__).parent


def _imported_modules(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def test_no_module_but_the_package_entry_imports_server_py():
    importers = [
        p.name
        for p in sorted(PACKAGE.glob("*.py"))
        if p.name not in ("__init__.py", "server.py")
        and "slime.servers.embedded.server" in _imported_modules(ast.parse(p.read_text()))
    ]
    assert not importers, f"these import server.py (type against state.ServerState instead): {importers}"
