"""Shared helpers for the simulated-engine tests: fixed-length configs and an event-loop poll."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from slime.servers.sim import SimConfig

FAST = 1000.0
"""time_scale for tests that only need ordering: an 8 ms step sleeps 8 us."""


def fixed_config(length: int, **overrides: Any) -> SimConfig:
    """Every trajectory is exactly ``length`` tokens (median == p99 makes the log-normal a point)."""
    base: dict[str, Any] = dict(
        response_len_median=length, response_len_p99=length, time_scale=FAST, weight_sync_ms=0.0
    )
    base.update(overrides)
    return SimConfig(**base)


async def until(predicate: Callable[[], bool], *, max_yields: int = 100_000) -> None:
    """Yield to the loop until ``predicate()`` holds (no wall-clock sleeps)."""
    for _ in range(max_yields):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"condition not reached after {max_yields} yields")
