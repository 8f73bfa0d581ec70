"""Every ``docs/sglang.md#anchor`` cited in the code names a section that exists (the protocol facts
the code relies on live there, not in a document outside the repository)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANCHORS = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', (ROOT / "docs" / "sglang.md").read_text()))


def cited() -> set[tuple[str, str]]:
    """``(file, anchor)`` for each ``docs/sglang.md#a`` and each ``, #b`` that continues such a citation."""
    found = set()
    for path in [*(ROOT / "slime").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        if path == Path(__file__).resolve():
            continue
        for m in re.finditer(r"docs/sglang\.md#([a-z0-9-]+)((?:, #[a-z0-9-]+)*)", path.read_text()):
            found |= {(str(path.relative_to(ROOT)), a) for a in [m.group(1), *re.findall(r"#([a-z0-9-]+)", m.group(2))]}
    return found


def test_the_code_cites_the_protocol_reference():
    anchors = {a for _, a in cited()}
    assert {"abort", "pause", "generate-response", "errors"} <= anchors


def test_every_cited_section_exists():
    missing = sorted(f"{f}: docs/sglang.md#{a}" for f, a in cited() if a not in ANCHORS and a != "protocol-reference")
    assert not missing, "\n".join(missing)


def test_no_reference_to_sections_of_a_document_outside_the_repository():
    bad = [str(p.relative_to(ROOT)) for p in (ROOT / "slime").rglob("*.py") if "§" in p.read_text()]
    assert not bad
