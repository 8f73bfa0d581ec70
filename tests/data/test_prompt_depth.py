"""Prompt files are parsed under a depth limit (issue 26 item 6): a line nested deeper than ``MAX_JSON_DEPTH``
is a bad row with its ``path:line``, like any malformed line, not a ``RecursionError`` without a place."""

from __future__ import annotations

import re

import pytest

from slime.data.dataset import load_prompt_file
from slime.errors import DataError

LIMIT = 100  # slime.data.jsonl.MAX_JSON_DEPTH


def _nested(depth: int) -> bytes:
    """A row whose metadata nests ``depth`` lists (the row object itself is one level more)."""
    return b'{"prompt": "a", "meta": ' + b"[" * depth + b"]" * depth + b"}\n"


@pytest.mark.parametrize("depth", [150, 5000, 100_000])
def test_a_too_deep_line_is_a_bad_row_named_by_file_and_line(tmp_path, depth):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n' + _nested(depth))
    with pytest.raises(
        DataError, match=re.escape(f"{path}:2: JSON nested deeper than {LIMIT} levels") + r" \(use --on-bad-data skip"
    ):
        load_prompt_file(path)


def test_a_too_deep_line_is_skipped_and_counted_with_skip(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(_nested(5000) + b'{"prompt": "ok"}\n' + _nested(LIMIT + 1))
    rows, bad = load_prompt_file(path, on_bad_data="skip")
    assert [r.prompt for r in rows] == ["ok"] and bad == 2


def test_nesting_up_to_the_limit_is_a_row(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(_nested(LIMIT - 1) + b'{"prompt": "b", "meta": {"k": [1, [2, {"x": 3}]]}}\n')
    rows, bad = load_prompt_file(path)  # the row object and its 99 lists: 100 levels, the limit
    assert [r.prompt for r in rows] == ["a", "b"] and bad == 0


def test_slime_train_names_the_too_deep_line_in_one_line(tmp_path, capsys):
    from slime.cli import main

    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "1+1", "label": "2"}\n' + _nested(5000))
    argv = ["train", "--dry-run", "--save", str(tmp_path / "run"), "--prompt-data", str(path), "--rm-type", "arith"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"slime train: error: {path}:2: JSON nested deeper than {LIMIT} levels"
    ), err
