"""Prompt JSONL loading: bad lines are named by file and line; sources resume exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime.data.dataset import PromptSource, load_jsonl_prompts
from slime.errors import DataError


def _write(tmp_path, lines):
    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize(
    "bad, why",
    [
        ('{"prompt": "1+1=", "label": "2"', "invalid JSON"),
        ('[1, 2]', "expected a JSON object"),
        ('{"label": "2"}', "missing key 'prompt'"),
        ('{"prompt": 5}', "must be a non-empty string"),
        ('{"prompt": "x", "meta": [1]}', "must be an object"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, why):
    p = _write(tmp_path, ['{"prompt": "1+1=", "label": "2"}', "", bad])
    with pytest.raises(DataError) as info:
        load_jsonl_prompts(p, metadata_key="meta")
    assert f"{p}:3:" in str(info.value) and why in str(info.value)


def test_skip_mode_counts_bad_lines_and_keeps_good_ones(tmp_path):
    p = _write(tmp_path, ['{"prompt": "a", "label": 1}', "not json", '{"prompt": "b"}'])
    rows, bad = load_jsonl_prompts(p, on_bad_data="skip")
    assert bad == 1 and [r.prompt for r in rows] == ["a", "b"] and rows[0].label == "1" and rows[1].label is None


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_jsonl_prompts(tmp_path / "nope.jsonl")


def test_gsm8k_loads_with_users_keys():
    rows, bad = load_jsonl_prompts(str(Path(__file__).parents[2] / "data" / "gsm8k" / "test.jsonl"), input_key="question", label_key="answer")
    assert bad == 0 and len(rows) == 1319 and rows[0].label.endswith("#### 18")


def test_prompt_source_is_seeded_and_resumes_at_its_position(tmp_path):
    rows, _ = load_jsonl_prompts(_write(tmp_path, [f'{{"prompt": "p{i}"}}' for i in range(7)]))
    a = PromptSource(rows, shuffle=True, seed=3)
    first = [a.next().prompt for _ in range(10)]  # crosses an epoch
    b = PromptSource(rows, shuffle=True, seed=3)
    [b.next() for _ in range(4)]
    c = PromptSource(rows, shuffle=True, seed=3)
    c.load_state_dict(b.state_dict())
    assert [c.next().prompt for _ in range(6)] == first[4:]
    assert sorted(first[:7]) == sorted(r.prompt for r in rows)
