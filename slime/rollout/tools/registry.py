"""The tool registry: ``name -> async fn(arguments) -> str``, each with an OpenAI function schema.

A tool is a plugin: whatever it does wrong (raises, hangs past ``timeout_s``, returns a non-string,
is called with arguments that are not an object, or does not exist) becomes the text of the tool
message the model sees next (``"Error: ..."``), never an exception in the rollout. A sync function
is run in a worker thread.

Example::

    registry = ToolRegistry([calculator_tool()], timeout_s=5.0)
    registry.schemas    # [{"type": "function", "function": {"name": "calculator", ...}}]
    await registry.call("calculator", {"expression": "2**10"})
    # ToolResult(name="calculator", content="1024", error=None, elapsed_s=0.0001)

Not covered: a sync tool that hangs keeps its worker thread busy after the timeout (Python threads
cannot be killed); tools are assumed idempotent, since a rollout interrupted between a turn and its
tool results runs them again on resume (``slime/rollout/multiturn.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from slime.rollout import plugin_threads

__all__ = ["Tool", "ToolResult", "ToolRegistry"]

ToolFn = Callable[[dict[str, Any]], Awaitable[str] | str]


@dataclasses.dataclass(frozen=True)
class Tool:
    """One callable tool.

    Attributes:
        name: the function name the model writes in ``<tool_call>{"name": ...}``.
        description: one line for the model.
        parameters: JSON schema of the arguments object (``{"type": "object", "properties": ...}``).
        fn: ``async fn(arguments: dict) -> str`` (or a sync one, run in a thread).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: ToolFn

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema, as chat templates expect in ``tools=``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What one tool call produced: ``content`` is what the model sees (an error text on failure)."""

    name: str
    content: str
    error: str | None = None
    """None on success; else the failure kind and message (also in ``content``)."""
    elapsed_s: float = 0.0


class ToolRegistry:
    """Tools by name; ``call`` never raises for a tool's own failure.

    Args:
        tools: the tools to register.
        timeout_s: per call; a slower tool yields an error message.
        max_output_chars: a longer result is cut to this many characters (plus a marker).
    Raises:
        ValueError: two tools with one name, or a non-positive limit.
    """

    def __init__(self, tools: Iterable[Tool] = (), *, timeout_s: float = 10.0, max_output_chars: int = 8192):
        if timeout_s <= 0 or max_output_chars <= 0:
            raise ValueError(f"ToolRegistry: timeout_s={timeout_s} and max_output_chars={max_output_chars} must be > 0")
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """[num_tools] OpenAI function schemas, in registration order (for ``apply_chat_template(tools=)``)."""
        return [t.schema for t in self._tools.values()]

    async def call(self, name: str, arguments: Any) -> ToolResult:
        """Run tool ``name``; every failure becomes ``ToolResult(content="Error: ...", error=...)``."""
        t0 = time.monotonic()
        tool = self._tools.get(name)
        if tool is None:
            return _failed(name, f"unknown tool {name!r}; available tools: {self.names}", t0)
        if not isinstance(arguments, dict):
            return _failed(name, f"arguments must be a JSON object, got {type(arguments).__name__}", t0)
        try:
            async with asyncio.timeout(self.timeout_s):
                call = getattr(tool.fn, "__call__", None)  # noqa: B004  # an async __call__ counts too
                if inspect.iscoroutinefunction(tool.fn) or inspect.iscoroutinefunction(call):
                    out = await tool.fn(arguments)  # type: ignore[misc]  # iscoroutinefunction checked it; mypy cannot narrow a callable
                else:
                    out = await plugin_threads.run_sync(tool.fn, arguments)  # a hung one is abandoned
                    if inspect.isawaitable(out):
                        out = await out
        except TimeoutError:
            return _failed(name, f"timed out after {self.timeout_s}s", t0)
        except Exception as exc:  # plugin boundary: a tool's failure is the next observation
            return _failed(name, f"{type(exc).__name__}: {exc}", t0)
        if not isinstance(out, str):
            return _failed(name, f"tool returned {type(out).__name__}, expected str", t0)
        if len(out) > self.max_output_chars:
            out = out[: self.max_output_chars] + f"\n...[truncated {len(out) - self.max_output_chars} chars]"
        return ToolResult(name=name, content=out, elapsed_s=time.monotonic() - t0)


def _failed(name: str, message: str, t0: float) -> ToolResult:
    return ToolResult(name=name, content=f"Error: {message}", error=message, elapsed_s=time.monotonic() - t0)
