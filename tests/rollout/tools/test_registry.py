"""A failing, hanging, unknown or misused tool becomes a tool message, never an exception."""

from __future__ import annotations

import asyncio

from slime.rollout.tools.registry import Tool, ToolRegistry


def _tool(name, fn):
    return Tool(name=name, description="d", parameters={"type": "object", "properties": {}}, fn=fn)


async def test_a_raising_tool_becomes_an_error_message():
    async def boom(args):
        raise RuntimeError("disk on fire")

    result = await ToolRegistry([_tool("boom", boom)]).call("boom", {})
    assert result.content == "Error: RuntimeError: disk on fire" and result.error


async def test_a_hanging_tool_times_out_into_an_error_message():
    async def hang(args):
        await asyncio.Event().wait()

    result = await ToolRegistry([_tool("hang", hang)], timeout_s=0.05).call("hang", {})
    assert "timed out after 0.05s" in result.content


async def test_unknown_tool_and_non_object_arguments_are_reported():
    async def ok(args):
        return "ok"

    reg = ToolRegistry([_tool("ok", ok)])
    assert "unknown tool 'nope'" in (await reg.call("nope", {})).content
    assert "must be a JSON object" in (await reg.call("ok", [1, 2])).content


async def test_sync_tool_runs_and_long_output_is_cut():
    reg = ToolRegistry([_tool("big", lambda args: "x" * 100)], max_output_chars=10)
    result = await reg.call("big", {})
    assert result.content.startswith("x" * 10 + "\n...[truncated 90 chars]") and result.error is None


def test_schemas_are_openai_function_schemas():
    reg = ToolRegistry([_tool("a", lambda a: ""), _tool("b", lambda a: "")])
    assert [s["function"]["name"] for s in reg.schemas] == ["a", "b"] and reg.schemas[0]["type"] == "function"
