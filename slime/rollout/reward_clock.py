"""The reward deadline stands still while a reward waits its turn for a shared resource.

``--reward-timeout-s`` bounds what a reward function does for its sample. A code reward also waits for
one of the sandbox's slots (``Sandbox``: as many as CPUs), and under load that wait is other samples'
time: a red-team test queued 13 ``time.sleep(60)`` samples beside one correct sample, and the correct
one was marked FAILED by the deadline before its code ever ran (the sleepers escaped their 0 reward the
same way). So ``score_sample`` / ``score_group`` run the reward under a ``RewardClock``, and a wait
inside ``queued()`` pauses it: the time left is kept and given back when the wait ends. Each sandbox
run still has its own time limit, so a paused reward cannot hang on the code it runs.

Example: timeout 30 s; the reward queues 40 s for a slot, then its code runs 2 s -> scored, 28 s left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar

__all__ = ["RewardClock", "queued", "running_under"]


class RewardClock:
    """Pauses an ``asyncio.Timeout`` while >= 1 task of its reward waits in ``queued()``.

    Args:
        deadline: the reward's ``asyncio.timeout(...)``, entered (its ``when()`` set).
    """

    def __init__(self, deadline: asyncio.Timeout):
        self._deadline = deadline
        self._waiting = 0
        self._left_s: float | None = None

    def pause(self) -> None:
        """A wait begins: the first one stops the clock, keeping the seconds left."""
        when = self._deadline.when()
        if self._waiting == 0 and when is not None and not self._deadline.expired():
            self._left_s = max(0.0, when - asyncio.get_running_loop().time())
            self._deadline.reschedule(None)
        self._waiting += 1

    def resume(self) -> None:
        """A wait ends: the last one restarts the clock with the seconds it had left."""
        self._waiting -= 1
        if self._waiting == 0 and self._left_s is not None:
            self._deadline.reschedule(asyncio.get_running_loop().time() + self._left_s)
            self._left_s = None


_CLOCK: ContextVar[RewardClock | None] = ContextVar("slime_reward_clock", default=None)


@contextlib.contextmanager
def running_under(deadline: asyncio.Timeout) -> Iterator[None]:
    """Inside: ``queued()`` waits (in this task and the tasks it starts) pause ``deadline``."""
    token = _CLOCK.set(RewardClock(deadline))
    try:
        yield
    finally:
        _CLOCK.reset(token)


@contextlib.asynccontextmanager
async def queued() -> AsyncIterator[None]:
    """Inside: waiting for a shared slot, not the reward's own time (no effect outside a reward)."""
    clock = _CLOCK.get()
    if clock is not None:
        clock.pause()
    try:
        yield
    finally:
        if clock is not None:
            clock.resume()
