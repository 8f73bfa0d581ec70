"""The checks of a prompt row's structured fields: chat messages, their tool calls and the row's tools.

``slime.data.dataset.parse_prompt_row`` (and ``slime.data.sft``'s rows) call ``messages_of`` for a
chat-message input (``--input-key`` with ``--apply-chat-template``) and ``tools_of`` for the row's
tools (``--tool-key``). Each raises ValueError saying which key, message or tool is wrong and what it
holds (the caller adds the row's ``path:line``); a tool list or a tool call's ``arguments`` may be
given as a JSON string, as Parquet files often store them. ``describe_list`` and ``short`` render a
bad value, in JSON's words, for those messages.
"""

from __future__ import annotations

import json
from typing import Any

from slime.types import JsonObject

__all__ = ["messages_of", "tools_of", "describe_list", "short"]


def messages_of(value: list[Any], key: str) -> list[JsonObject]:
    if not value:
        raise ValueError(f"key {key!r} (--input-key) is an empty list of messages")
    if not any(isinstance(m, dict) for m in value):
        raise ValueError(
            f"key {key!r} (--input-key) must be a list of chat messages ({{'role': ..., 'content': ...}}), got {describe_list(value)}"
        )
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(
                f"key {key!r} (--input-key): message {i} must be an object with a string 'role', got {short(m)}"
            )
        for j, call in enumerate(m.get("tool_calls") or []):
            _check_tool_call(call, f"key {key!r} (--input-key): message {i} tool_calls[{j}]")
    return [dict(m) for m in value]


def _check_tool_call(call: object, where: str) -> None:
    """An OpenAI-style tool call: ``{"function": {"name": str, "arguments": object or JSON-object string}}``."""
    fn = _function_of(call, where, "{'type': 'function', 'function': {'name': ..., 'arguments': ...}}")
    args = _json_if_string(fn.get("arguments", {}), f"{where}: 'arguments'")
    if not isinstance(args, dict):
        raise ValueError(f"{where}: 'arguments' must be a JSON object, got {type(args).__name__} {short(args)}")


def tools_of(value: object, key: str) -> list[JsonObject]:
    value = _json_if_string(value, f"key {key!r} (--tool-key)")
    if not isinstance(value, list):
        raise ValueError(f"key {key!r} (--tool-key) must be a list of tools, got {type(value).__name__} {short(value)}")
    for i, tool in enumerate(value):
        _function_of(
            tool,
            f"key {key!r} (--tool-key): tool {i}",
            "{'type': 'function', 'function': {'name': ...}} (OpenAI function schema)",
        )
    return value


def _function_of(obj: object, where: str, shape: str) -> JsonObject:
    """``obj["function"]``, which must be an object with a string ``name``; else ValueError naming ``where``."""
    fn = obj.get("function") if isinstance(obj, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValueError(f"{where} must be {shape}, got {short(obj)}")
    return fn


def _json_if_string(value: object, what: str) -> Any:
    """``value``, or the JSON it holds when it is a string; ValueError naming ``what`` if that is not JSON."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is a string but not JSON ({exc}): {short(value)}") from None


_JSON_KINDS = {
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "list",
    type(None): "null",
}


def describe_list(value: list[object]) -> str:
    """What a JSON list holds, in JSON's words. Example: ["a", "b"] -> "a list of 2 strings ['a', 'b']";
    [1, "a"] -> "a list of 2 items (number, string) [1, 'a']"."""
    kinds = sorted({_JSON_KINDS.get(type(v), type(v).__name__) for v in value})
    if not kinds:
        return "an empty list"
    what = f"{kinds[0]}s" if len(kinds) == 1 else f"items ({', '.join(kinds)})"
    return f"a list of {len(value)} {what} {short(value)}"


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
