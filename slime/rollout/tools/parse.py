"""Parse Hermes / Qwen-style tool calls out of a model turn's text.

Format (what Qwen2.5 / Hermes chat templates teach the model)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2+2"}}
    </tool_call>

Tolerated: several blocks per turn; whitespace and a ```json fence inside a block; ``arguments``
given as a JSON *string* (OpenAI style) or under ``parameters``; a last block whose closing tag is
missing (the model stopped right after the JSON). Each block becomes a ``ToolCall``, or, when it
cannot be used (bad JSON, no name, arguments not an object), a ``ToolCall`` with ``error`` set so
that the model is told what was wrong in the next tool message.

Example::

    parse_tool_calls('x <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    # [ToolCall(name="f", arguments={"a": 1}, error=None, raw='{"name": ...}')]

Not covered: other formats (Llama-3 ``<|python_tag|>``, Mistral ``[TOOL_CALLS]``, JSON without tags).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from slime.data.tool_markers import TOOL_CALL_CLOSE, TOOL_CALL_OPEN  # re-exported: the markup's one spelling

__all__ = ["ToolCall", "parse_tool_calls", "TOOL_CALL_OPEN", "TOOL_CALL_CLOSE"]

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_MAX_RAW_CHARS = 2000


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed block. ``error`` is None when ``name`` and ``arguments`` are usable."""

    name: str | None
    arguments: dict[str, Any]
    error: str | None = None
    raw: str = ""
    """The block's text between the tags (cut to 2000 chars), for the rollout dump."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "error": self.error, "raw": self.raw}


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>`` block of ``text``, in order; [] when there is none."""
    return [_parse_block(m.group(1)) for m in _BLOCK.finditer(text)]


def _parse_block(body: str) -> ToolCall:
    raw = body.strip()
    fenced = _FENCE.match(raw)
    payload = fenced.group(1) if fenced else raw
    clipped = raw[:_MAX_RAW_CHARS]
    if not payload:
        return ToolCall(None, {}, "empty <tool_call> block", clipped)
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError as exc:
        return ToolCall(
            None, {}, f"tool call is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", clipped
        )
    if not isinstance(obj, dict):
        return ToolCall(
            None, {}, f"tool call must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}", clipped
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, {}, "tool call has no 'name' string", clipped)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCall(
                name, {}, f"'arguments' of {name!r} is a string that is not valid JSON ({exc.msg})", clipped
            )
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name, {}, f"'arguments' of {name!r} must be a JSON object, got {type(args).__name__}", clipped)
    return ToolCall(name, args, None, clipped)
