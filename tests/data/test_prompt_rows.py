"""What a prompt row must hold, said in one line with ``file:line``: the input's real shape, and a label
whenever the run's reward reads one (``needs_label``)."""

from __future__ import annotations

import json
import re

import pytest

from slime.data.dataset import PromptRow, load_prompt_file
from slime.errors import DataError


def _write(tmp_path, rows):
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


@pytest.mark.parametrize(
    "row, template, message",
    [
        (
            {"prompt": ["a", "b"]},
            False,
            "key 'prompt' (--input-key) must be a non-empty string, got a list of 2 strings ['a', 'b']",
        ),
        (
            {"prompt": [1, "a"]},
            False,
            "key 'prompt' (--input-key) must be a non-empty string, got a list of 2 items (number, string) [1, 'a']",
        ),
        (
            {"prompt": [{"role": "user", "content": "hi"}]},
            False,
            "key 'prompt' (--input-key) is a list of chat messages; render it with --apply-chat-template",
        ),
        (
            {"prompt": ["a", "b"]},
            True,
            "key 'prompt' (--input-key) must be a list of chat messages ({'role': ..., 'content': ...}), got a list of 2 strings ['a', 'b']",
        ),
    ],
    ids=["strings", "mixed", "messages without template", "strings with template"],
)
def test_a_list_under_the_input_key_is_described_as_what_it_is(tmp_path, row, template, message):
    p = _write(tmp_path, [row])
    with pytest.raises(DataError) as info:
        load_prompt_file(p, apply_chat_template=template)
    assert str(info.value).startswith(f"{p}:1: {message} (use --on-bad-data skip")


@pytest.mark.parametrize(
    "row, why",
    [
        ({"prompt": "a"}, "key 'label' (--label-key) is missing (keys present: ['prompt'])"),
        ({"prompt": "a", "label": None}, "key 'label' (--label-key) is null"),
        ({"prompt": "a", "label": " "}, "key 'label' (--label-key) is blank"),
    ],
    ids=["missing", "null", "blank"],
)
def test_a_row_without_a_label_is_refused_when_the_reward_needs_one(tmp_path, row, why):
    p = _write(tmp_path, [{"prompt": "ok", "label": "1"}, row])
    with pytest.raises(DataError, match="^" + re.escape(f"{p}:2: {why}") + ".*; the reward needs a reference answer"):
        load_prompt_file(p, require_label=True, flag="--prompt-data")
    rows, num_bad = load_prompt_file(p, require_label=True, on_bad_data="skip")
    assert rows == [PromptRow(index=0, prompt="ok", label="1")] and num_bad == 1
    assert len(load_prompt_file(p)[0]) == 2  # a reward that reads no label: the row is fine


def test_a_reward_that_reads_the_label_says_so():
    from slime.data import arith, calc
    from slime.rollout.verifiers.code import CodeVerifier
    from slime.rollout.verifiers.math import MathVerifier

    assert arith.reward.needs_label and calc.reward.needs_label and MathVerifier(timeout_s=1).needs_label
    assert not getattr(CodeVerifier(), "needs_label", False)  # its tests may come from metadata instead
