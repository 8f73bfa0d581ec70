"""Large prompt files are streamed (issue 26, "a 200 MB prompt file is read whole"): the run's loader keeps a
byte offset per good row, not the rows, and reads a row back when it hands it out. The rows, their order
(shuffled, curriculum), the bad-row errors and counts are those of reading the file whole.

Memory is measured with ``tracemalloc`` (allocations, not time): what the loaded train rows keep must not grow
with the file's bytes. The 200 MB measurement itself is ``scripts/measure_prompt_memory.py``.
"""

from __future__ import annotations

import json
import os
import re
import tracemalloc

import pytest

from slime.config import DataConfig
from slime.data.dataset import PromptSource, load_prompt_file
from slime.errors import DataError
from slime.loop.inputs import load_prompts
from tests.test_bad_input import DATA


def _write(path, rows: int, prompt_bytes: int = 400) -> int:
    filler = "x" * prompt_bytes
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"prompt": f"q{i} {filler}", "label": str(i), "level": (i * 7) % 5}) + "\n")
    return path.stat().st_size


def _kept_bytes(path) -> tuple[int, int]:
    """(bytes still allocated while the loaded train rows are held, peak bytes while loading)."""
    tracemalloc.start()
    try:
        train, _ = load_prompts(DataConfig(prompt_data=str(path), num_eval_prompts=0), seed=1)
        kept, peak = tracemalloc.get_traced_memory()
        assert len(train) > 0
    finally:
        tracemalloc.stop()
    return kept, peak


def test_the_loaded_train_rows_do_not_hold_the_file(tmp_path):
    size = _write(tmp_path / "p.jsonl", 20_000)  # ~8 MB
    kept, peak = _kept_bytes(tmp_path / "p.jsonl")
    assert kept < size / 20, (kept, size)  # 8 bytes an offset against ~420 bytes a row (read whole: > 1x the file)
    assert peak < size / 4, (peak, size)  # one row at a time


def test_what_is_kept_grows_by_an_offset_a_row_not_by_the_rows_bytes(tmp_path):
    _write(tmp_path / "small.jsonl", 5_000, prompt_bytes=2000)
    _write(tmp_path / "large.jsonl", 20_000, prompt_bytes=2000)
    small, _ = _kept_bytes(tmp_path / "small.jsonl")
    large, _ = _kept_bytes(tmp_path / "large.jsonl")
    assert (large - small) / 15_000 < 100, (small, large)  # bytes per extra row; each row is ~2 KB of file


def test_streamed_rows_are_the_rows_of_the_file_read_whole(tmp_path):
    path = tmp_path / "p.jsonl"
    _write(path, 50, prompt_bytes=3)
    with path.open("ab") as f:
        f.write(b'\n  \n{"prompt": 5}\n{"prompt": "last", "level": 9}\n')
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # a byte-order mark on the first line
    kw = dict(curriculum_key="level", on_bad_data="skip")
    whole, bad_whole = load_prompt_file(path, **kw)
    from slime.data.prompt_index import index_prompt_file

    streamed, bad_streamed = index_prompt_file(path, **kw)
    assert bad_streamed == bad_whole == 1 and len(streamed) == len(whole) == 51
    assert list(streamed) == whole and streamed[-1] == whole[-1] and streamed[3:6] == whole[3:6]
    for shuffle in (False, True):
        for curriculum in (False, True):
            a = PromptSource(whole, shuffle=shuffle, seed=3, curriculum=curriculum)
            b = PromptSource(streamed, shuffle=shuffle, seed=3, curriculum=curriculum)
            assert [a.next() for _ in range(120)] == [b.next() for _ in range(120)]  # over two epochs


@pytest.mark.parametrize("content, kwargs, pattern", [d[1:] for d in DATA], ids=[d[0] for d in DATA])
def test_a_streamed_file_names_its_bad_lines_as_before(tmp_path, content, kwargs, pattern):
    from slime.data.prompt_index import index_prompt_file

    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(str(path)) + ".*" + pattern):
        index_prompt_file(path, **kwargs)


def test_a_file_changed_after_the_load_is_named_when_a_row_is_read(tmp_path):
    from slime.data.prompt_index import index_prompt_file

    path = tmp_path / "p.jsonl"
    _write(path, 10, prompt_bytes=3)
    rows, _ = index_prompt_file(path)
    assert rows[2].prompt.startswith("q2 ")
    path.write_text(path.read_text() + json.dumps({"prompt": "new"}) + "\n")
    os.utime(path, ns=(1, 1))
    with pytest.raises(DataError, match=re.escape(f"{path}: changed since the run loaded it")):
        rows[2]


def test_eval_sets_hold_only_the_rows_they_score(tmp_path):
    path = tmp_path / "e.jsonl"
    _write(path, 300, prompt_bytes=3)
    config = DataConfig(prompt_data=str(path), eval_prompt_data=str(path), num_eval_prompts=7)
    _, evals = load_prompts(config, seed=1)
    assert isinstance(evals, list) and [r.index for r in evals] == list(range(7))


def test_a_stop_request_ends_a_load_within_1024_rows(tmp_path):
    """SIGTERM during data loading (slime.stop): the reading thread raises instead of reading on."""
    from slime import stop

    path = tmp_path / "p.jsonl"
    _write(path, 5000, prompt_bytes=3)
    seen = []

    def check(row):
        seen.append(row.index)
        if row.index == 100:
            stop.request_stop()

    try:
        with pytest.raises(stop.Stopped, match=re.escape(f"SIGTERM while reading {path}")):
            load_prompt_file(path, check=check)
    finally:
        stop.clear()
    assert len(seen) <= 1024 + 1
