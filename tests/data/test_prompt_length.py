"""A prompt longer than the model's context is a bad row at load time, named by file and line."""

from __future__ import annotations

import json

import pytest

from slime.data.dataset import load_prompt_file, prompt_length_check
from slime.errors import DataError


def _tokenize(prompt, tools=None):
    return [1] + [len(w) for w in (prompt if isinstance(prompt, str) else prompt[-1]["content"]).split()]


def _write(path, prompts):
    path.write_text("".join(json.dumps({"prompt": p, "label": "1"}) + "\n" for p in prompts))
    return path


def test_a_prompt_longer_than_the_context_names_file_line_and_both_numbers(tmp_path):
    path = _write(tmp_path / "p.jsonl", ["a b", "w " * 40, "c"])
    with pytest.raises(DataError) as info:
        load_prompt_file(path, check=prompt_length_check(_tokenize, max_len=32))
    message = str(info.value)
    assert f"{path}:2:" in message and "41 tokens" in message and "context of 32" in message
    assert "--on-bad-data skip" in message


def test_on_bad_data_skip_drops_the_long_prompt_and_counts_it(tmp_path):
    path = _write(tmp_path / "p.jsonl", ["a b", "w " * 40, "c"])
    rows, num_bad = load_prompt_file(path, on_bad_data="skip", check=prompt_length_check(_tokenize, max_len=32))
    assert [r.prompt for r in rows] == ["a b", "c"] and num_bad == 1 and [r.index for r in rows] == [0, 1]


def test_prompts_that_cannot_reach_the_context_are_not_tokenized():
    calls = []

    def tokenize(prompt, tools=None):
        calls.append(prompt)
        return _tokenize(prompt)

    from slime.data.dataset import PromptRow

    check = prompt_length_check(tokenize, max_len=1000)
    calls.clear()
    check(PromptRow(index=0, prompt="short"))
    assert calls == []
    check(PromptRow(index=0, prompt="x" * 2000))  # may be long enough: measured
    assert len(calls) == 1


def test_rollout_max_prompt_len_makes_longer_prompts_bad_rows_named_by_file_and_line(tmp_path):
    path = _write(tmp_path / "p.jsonl", ["a b", "w w w w", "c"])  # 3, 5 and 2 tokens
    with pytest.raises(DataError, match=rf"{path}:2: the prompt renders to 5 tokens, over --rollout-max-prompt-len 4"):
        load_prompt_file(path, check=prompt_length_check(_tokenize, max_len=1000, max_prompt_len=4))
    rows, num_bad = load_prompt_file(
        path, on_bad_data="skip", check=prompt_length_check(_tokenize, max_len=None, max_prompt_len=4)
    )
    assert [r.prompt for r in rows] == ["a b", "c"] and num_bad == 1
    rows, _ = load_prompt_file(
        path, check=prompt_length_check(_tokenize, max_len=1000, max_prompt_len=5)
    )  # 5 is not over 5
    assert len(rows) == 3


def test_rollout_max_prompt_len_is_slimes_flag():
    from slime.cli.args import build_parser, config_from_args
    from slime.errors import ConfigError

    assert (
        config_from_args(build_parser().parse_args(["--rollout-max-prompt-len", "256"])).data.rollout_max_prompt_len
        == 256
    )
    with pytest.raises(ConfigError, match="--rollout-max-prompt-len=0 is invalid"):
        config_from_args(build_parser().parse_args(["--rollout-max-prompt-len", "0"]))
