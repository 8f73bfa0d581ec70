"""Tool-call parsing: Hermes / Qwen ``<tool_call>`` blocks, with broken ones reported, not dropped."""

from __future__ import annotations

from slime.rollout.tools.parse import parse_tool_calls


def test_two_blocks_parse_in_order_with_arguments():
    text = (
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>\n'
        '<tool_call>{"name": "retrieval", "arguments": {"query": "paris"}}</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "6*7"}, None),
        ("retrieval", {"query": "paris"}, None),
    ]


def test_text_without_tool_calls_gives_none():
    assert parse_tool_calls("The answer is 42.") == []


def test_bad_json_becomes_an_error_entry_naming_the_problem():
    [call] = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}</tool_call>')
    assert call.name is None and "not valid JSON" in call.error


def test_arguments_as_json_string_and_fenced_block_are_accepted():
    text = '<tool_call>\n```json\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n```\n</tool_call>'
    [call] = parse_tool_calls(text)
    assert (call.name, call.arguments, call.error) == ("f", {"a": 1}, None)


def test_missing_closing_tag_at_the_end_still_parses():
    [call] = parse_tool_calls('<tool_call>{"name": "f", "arguments": {}}')
    assert (call.name, call.arguments, call.error) == ("f", {}, None)


def test_non_object_arguments_and_missing_name_are_errors():
    no_name, bad_args = parse_tool_calls(
        '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "f", "arguments": [1]}</tool_call>'
    )
    assert "no 'name'" in no_name.error
    assert bad_args.name == "f" and "must be a JSON object" in bad_args.error
