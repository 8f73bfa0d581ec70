"""JSONL lines as the dataset readers see them: non-blank lines with their number and byte offset, each decoded
under a depth limit, and one line read back from its offset (``slime.data.prompt_index``).

A line nested deeper than ``MAX_JSON_DEPTH`` arrays / objects is a bad row like any malformed one (its
``path:line`` and why), not a ``RecursionError`` from the decoder (past ~1000 levels) or from whatever walks the
row later. Example: ``{"prompt": "a", "m": [[[...]]]}`` with 5000 brackets -> ``data.jsonl:7: JSON nested
deeper than 100 levels``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from slime.types import JsonObject

__all__ = ["MAX_JSON_DEPTH", "JsonObject", "jsonl_lines", "decode_line", "read_line_at"]


MAX_JSON_DEPTH = 100
"""Deepest nesting of arrays and objects a row may have (a chat row with tools is about 8 deep)."""

_BOM = b"\xef\xbb\xbf"


def jsonl_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """``(1-based line number, byte offset, raw line)`` of each non-blank line, read one line at a time (a UTF-8
    byte-order mark on the first line is skipped, its offset past it)."""
    offset = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            start = offset
            offset += len(raw)
            if lineno == 1 and raw.startswith(_BOM):
                raw, start = raw[len(_BOM) :], start + len(_BOM)
            if raw.strip():
                yield lineno, start, raw


def decode_line(decoder: msgspec.json.Decoder, raw: bytes) -> Any:
    """The line's JSON value, or the ``ValueError`` saying why it is none (invalid JSON, nested too deep)."""
    try:
        obj = decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return ValueError(f"invalid JSON ({exc})")
    except RecursionError:
        return ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    # only a line with that many brackets can be that deep (bytes.count is cheap next to the walk)
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _deeper_than(obj, MAX_JSON_DEPTH):
        return ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return obj


def _deeper_than(obj: object, limit: int) -> bool:
    """Whether ``obj`` nests lists / dicts more than ``limit`` deep (iterative: no recursion of its own)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def read_line_at(path: Path, offset: int) -> bytes:
    """The line that starts at byte ``offset`` of ``path`` (as ``jsonl_lines`` gave it)."""
    with path.open("rb") as f:
        f.seek(offset)
        return f.readline()
