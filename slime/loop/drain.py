"""Stopping generation: abort every request and wait until none is in flight, giving up on hung engines.

Used by the scheduler before a weight update that aborts (``paused("abort")``), a checkpoint and
shutdown. The abort is re-sent each second (a request sent just before it is caught by the next).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from slime.errors import PluginError
from slime.loop.generate_contract import function_name
from slime.rollout.generate import generate as default_generate

__all__ = ["drain"]

log = logging.getLogger(__name__)


async def drain(
    pool: Any,
    *,
    num_requests: Callable[[], int],
    wait_for: Callable[[Callable[[], bool]], Awaitable[None]],
    abort_timeout_s: float,
    generate_fn: Any,
) -> None:
    """Abort every request of ``pool`` and wait until ``num_requests()`` is 0.

    ``abort_timeout_s`` after the first abort, requests still running on an engine (one that does
    not honour ``/abort_request``: hung) are given up on: the pool ends them as aborted (their
    samples resume) and takes the engine out of rotation for the supervisor. Generate calls that
    still do not return then are the generate function's own doing.

    Args:
        num_requests: the generate calls in flight now.
        wait_for: waits until a predicate holds (the scheduler's condition).
        generate_fn: the run's generate function, named in the error.

    Raises:
        PluginError: calls of ``--custom-generate-function-path`` did not return, though no
            request of theirs has run on an engine for ``abort_timeout_s`` (it ignores aborts).
        RuntimeError: the same with the default generate function, or a pool that cannot give up.
    """
    loop = asyncio.get_running_loop()
    limit = abort_timeout_s
    deadline = loop.time() + limit
    while num_requests() > 0:
        with contextlib.suppress(TimeoutError):  # a hung engine answers no /abort_request either
            async with asyncio.timeout(max(deadline - loop.time(), 1.0)):
                await pool.abort_all()
        try:
            async with asyncio.timeout(1.0):
                await wait_for(lambda: num_requests() == 0)
        except TimeoutError:
            if loop.time() < deadline:
                continue
            hung = pool.give_up_inflight(
                f"still running {limit}s after abort_all", running_for_s=limit
            )  # None: cannot give up
            if hung:
                log.warning(
                    "engines %s did not end their requests %ss after abort_all: taken out of rotation, the "
                    "requests end as aborted and their samples resume",
                    hung,
                    limit,
                )
                deadline = loop.time() + limit
                continue
            _raise_stuck(num_requests(), limit, can_give_up=hung is not None, generate_fn=generate_fn)


def _raise_stuck(n: int, limit: float, *, can_give_up: bool, generate_fn: Any) -> None:
    if not can_give_up:
        raise RuntimeError(
            f"{n} generate requests still in flight {limit}s after abort_all; the engine does not honour /abort_request"
        )
    if generate_fn is default_generate:
        raise RuntimeError(
            f"{n} calls of the default generate function did not return {limit}s after abort_all, "
            "though no request has run on an engine that long"
        )
    raise PluginError(
        f"--custom-generate-function-path {function_name(generate_fn)} ignores aborts: {n} of its calls "
        f"did not return {limit}s after abort_all, though no request of theirs has run on an engine that long "
        "(the engines honoured the aborts). It must return as soon as pool.generate returns finish_reason "
        "abort, leaving the sample PARTIAL (it resumes later)"
    )
