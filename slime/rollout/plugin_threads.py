"""Sync plugin calls (reward functions, tools) on daemon threads that a hung call cannot pin.

``asyncio.to_thread`` runs on the loop's default executor, min(32, cpus + 4) threads shared with the
train step and checkpoint writes: a few sync rewards that never return take every thread (with 8
samples a step on a 2-core host the run deadlocks before its first train step), and ``asyncio.run``
joins those threads at exit, forever. Here each call gets a daemon thread of its own, at most
``MAX_THREADS`` running per event loop. A caller that stops waiting (its timeout) abandons the call:
the thread keeps its slot until the function returns, so stuck calls cannot pile up threads without
bound, and it never holds up exit (daemon threads are not joined).

Example: 64 slots and 3 calls hung for good: 61 slots serve every other call. Were all 64 stuck, a
new call would wait for a slot and end at its caller's timeout; ``num_running`` says how many are
running (stuck ones included), for the caller's error message.

Not covered: the stuck function itself goes on running (Python threads cannot be killed).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

__all__ = ["MAX_THREADS", "run_sync", "num_running"]

T = TypeVar("T")

MAX_THREADS = 64
"""Sync plugin calls running at once per event loop (above the default executor's 32: no slower)."""


class _Slots:
    def __init__(self) -> None:
        self.free = asyncio.Semaphore(MAX_THREADS)
        self.num_running = 0


_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slots] = weakref.WeakKeyDictionary()


def num_running() -> int:
    """Sync plugin calls running on this loop's threads now, abandoned (stuck) ones included."""
    slots = _SLOTS.get(asyncio.get_running_loop())
    return slots.num_running if slots else 0


async def run_sync(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on a daemon thread (module docstring), in a copy of the caller's context.

    Returns what ``fn`` returns; raises what it raises. Cancelling the caller (a timeout) abandons
    the call: it finishes on its own thread and frees its slot then.
    """
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        slots = _SLOTS[loop] = _Slots()
    await slots.free.acquire()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: T | None, error: BaseException | None) -> None:
        slots.num_running -= 1
        slots.free.release()
        if future.done():  # the caller stopped waiting
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]  # None only with an error

    def work() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = context.run(fn, *args)
        except BaseException as exc:  # handed to the caller as is
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    slots.num_running += 1
    try:
        threading.Thread(target=work, name=f"slime-plugin-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    except BaseException:
        slots.num_running -= 1
        slots.free.release()
        raise
    return await future
