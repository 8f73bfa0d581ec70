"""Prompt JSONL and Parquet loading: bad rows are named by file and line (or row); sources resume exactly."""

from __future__ import annotations

import json
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
        ("[1, 2]", "expected a JSON object"),
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
    rows, bad = load_jsonl_prompts(
        str(Path(__file__).parents[2] / "data" / "gsm8k" / "test.jsonl"), input_key="question", label_key="answer"
    )
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


# -- Parquet, tools, chat messages, curriculum ---------------------------------------------------

GSM8K = Path(__file__).parents[2] / "data" / "gsm8k" / "test.jsonl"


def _write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_gsm8k_as_parquet_loads_the_same_rows_as_the_jsonl(tmp_path):
    from slime.data.dataset import load_prompt_file

    objs = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    parquet = _write_parquet(tmp_path / "gsm8k.parquet", objs)
    from_jsonl, _ = load_prompt_file(GSM8K, input_key="question", label_key="answer")
    from_parquet, bad = load_prompt_file(parquet, input_key="question", label_key="answer")
    assert bad == 0 and len(from_parquet) == 1319 and from_parquet == from_jsonl


def test_a_bad_parquet_row_is_named_by_file_and_row_index(tmp_path):
    from slime.data.dataset import load_prompt_file

    p = _write_parquet(
        tmp_path / "p.parquet", [{"question": "a"}, {"question": "b"}, {"question": None}, {"question": " "}]
    )
    with pytest.raises(
        DataError, match=rf"{p} row 2: key 'question' \(--input-key\) must be a non-empty string, got NoneType"
    ):
        load_prompt_file(p, input_key="question")
    rows, bad = load_prompt_file(p, input_key="question", on_bad_data="skip")
    assert [r.prompt for r in rows] == ["a", "b"] and bad == 2


def test_a_file_named_parquet_that_is_not_parquet_is_a_clear_error(tmp_path):
    from slime.data.dataset import load_prompt_file

    p = tmp_path / "p.parquet"
    p.write_text('{"prompt": "a"}\n')
    with pytest.raises(DataError, match=f"{p}: not a readable Parquet file"):
        load_prompt_file(p)


def test_tools_and_chat_messages_are_kept_on_the_row(tmp_path):
    from slime.data.dataset import load_prompt_file, row_metadata

    tool = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"}]
    p = _write(
        tmp_path,
        [json.dumps({"prompt": msgs, "tools": [tool]}), json.dumps({"prompt": "2+2?", "tools": json.dumps([tool])})],
    )
    rows, _ = load_prompt_file(p, tool_key="tools", apply_chat_template=True)
    assert rows[0].messages == msgs and rows[0].prompt == "1+1?" and rows[0].tools == [tool]
    assert rows[1].messages is None and rows[1].tools == [tool]
    assert row_metadata(rows[0]) == {"tools": [tool], "messages": msgs}
    with pytest.raises(DataError, match=f"{p}:1: .*list of chat messages; render it with --apply-chat-template"):
        load_prompt_file(p, tool_key="tools")
    bad = _write(tmp_path, [json.dumps({"prompt": "x", "tools": [{"name": "calculator"}]})])
    with pytest.raises(
        DataError, match=f"{bad}:1: key 'tools' \\(--tool-key\\): tool 0 must be .*OpenAI function schema"
    ):
        load_prompt_file(bad, tool_key="tools")


def test_curriculum_orders_every_epoch_by_difficulty_with_seeded_ties(tmp_path):
    from slime.data.dataset import load_prompt_file

    levels = [3, 1, 2, 1, 3, 2, 1]
    p = _write(tmp_path, [json.dumps({"prompt": f"p{i}", "level": d}) for i, d in enumerate(levels)])
    rows, _ = load_prompt_file(p, curriculum_key="level")
    plain = PromptSource(rows, shuffle=False, curriculum=True)
    assert [plain.next().prompt for _ in range(14)] == ["p1", "p3", "p6", "p2", "p5", "p0", "p4"] * 2
    shuffled = PromptSource(rows, shuffle=True, seed=5, curriculum=True)
    epochs = [[shuffled.next() for _ in range(7)] for _ in range(3)]
    assert all([r.difficulty for r in e] == sorted(levels) for e in epochs)
    assert len({tuple(r.prompt for r in e) for e in epochs}) > 1, "ties should be reshuffled each epoch"
    missing = _write(tmp_path, [json.dumps({"prompt": "a", "level": 1}), json.dumps({"prompt": "b"})])
    with pytest.raises(
        DataError, match=f"{missing}:2: key 'level' \\(--curriculum-key\\) must be a number, got NoneType"
    ):
        load_prompt_file(missing, curriculum_key="level")
