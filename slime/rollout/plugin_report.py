"""What every ``slime check-plugin`` contract (``slime.rollout.plugin_contracts``) shares: the ``Report`` its
checks write their PASS/FAIL/WARN lines to, the probe prompt, and how a plugin is called under a timeout
(``call_plugin``: awaited when async, on a daemon thread of ``plugin_threads`` when sync).
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable
from typing import Any, TextIO

from slime.rollout import plugin_threads

__all__ = ["Report", "PROBE_PROMPT", "is_async", "call_plugin"]

PROBE_PROMPT = [0, 5, 9, 17, 3]
"""The prompt ids of the probe samples: ``0``, then the ids of the probe text ``w5 w9 w17 w3``."""


class Report:
    """Collects check lines; ``failed`` is True once any check failed."""

    def __init__(self, kind: str, out: TextIO | None = None):
        self.kind, self.out, self.failed = kind, out or sys.stdout, False
        self.lines: list[str] = []

    def _emit(self, tag: str, text: str) -> None:
        line = f"{tag} {self.kind}: {text}"
        self.lines.append(line)
        print(line, file=self.out, flush=True)

    def ok(self, text: str) -> None:
        self._emit("PASS", text)

    def fail(self, text: str) -> None:
        self.failed = True
        self._emit("FAIL", text)

    def warn(self, text: str) -> None:
        self._emit("WARN", text)


def is_async(fn: object) -> bool:
    """Whether ``fn`` is awaited when called: an ``async def`` function, or an object with an async ``__call__``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004  # an async __call__, not a callable test


async def call_plugin(
    report: Report, fn: Callable[..., Any], args: tuple[object, ...], timeout_s: float, *, run_async: bool | None = None
) -> tuple[bool, object]:
    """``fn(*args)`` within ``timeout_s`` (async: awaited; sync: on a daemon thread, abandoned at the timeout,
    ``plugin_threads``); returns ``(True, value)``, or ``(False, None)`` after reporting the timeout or exception.
    ``run_async`` says whether to await ``fn`` when ``is_async(fn)`` cannot tell (a ``functools.partial`` of it).
    (``fn`` is the user's plugin: untyped, its value is checked by the caller.)"""
    try:
        async with asyncio.timeout(timeout_s):
            value = (
                await fn(*args)
                if (is_async(fn) if run_async is None else run_async)
                else await plugin_threads.run_sync(fn, *args)
            )
            if inspect.isawaitable(value):
                value = await value
    except TimeoutError:
        report.fail(f"did not return within {timeout_s}s")
        return False, None
    except Exception as exc:  # the plugin's bug, reported as data
        report.fail(f"raised {type(exc).__name__}: {exc}")
        return False, None
    return True, value
