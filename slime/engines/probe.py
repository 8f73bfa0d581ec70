"""TCP probes of engine addresses: whether anything listens there at all.

A connection refused (ECONNREFUSED) at every address a host resolves to means no process listens on
that port: the engine is dead, not slow. The pool names such engines "dead" in its errors
(``pool_control.py``, ``pool_workers.py``), and a readiness wait on engines nobody here launched
stops early when they all refuse (``wait_unless_refused``).
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.parse
from collections.abc import Coroutine, Sequence
from typing import TypeVar

from slime.errors import EngineError, EngineUnavailable

__all__ = ["refuses_connections", "refused_throughout", "wait_unless_refused", "failure_line", "as_is"]

REFUSED_PROBE_INTERVAL_S = 0.5
"""Seconds between the TCP probes of ``refused_throughout``."""
_PROBE_TIMEOUT_S = 2.0
T = TypeVar("T")


async def refuses_connections(url: str) -> bool:
    """True when a TCP connect to ``url``'s host and port is refused (ECONNREFUSED) at every address the
    host resolves to: nothing listens there. False when one connects, or fails otherwise (a timeout, an
    unreachable network, a name that does not resolve)."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(_PROBE_TIMEOUT_S):
            infos = await loop.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError):
        return False
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setblocking(False)
            try:
                async with asyncio.timeout(_PROBE_TIMEOUT_S):
                    await loop.sock_connect(sock, address)
            except ConnectionRefusedError:
                continue
            except (OSError, TimeoutError):
                return False
            return False
    return bool(infos)


async def refused_throughout(urls: Sequence[str], grace_s: float) -> bool:
    """Probe every url each ``REFUSED_PROBE_INTERVAL_S`` for ``grace_s`` seconds: True when every probe of
    every url was refused (``refuses_connections``), False as soon as one was not."""
    deadline = time.monotonic() + grace_s
    while True:
        if not all(await asyncio.gather(*(refuses_connections(u) for u in urls))):
            return False
        if time.monotonic() >= deadline:
            return True
        await asyncio.sleep(min(REFUSED_PROBE_INTERVAL_S, max(0.0, deadline - time.monotonic())))


async def wait_unless_refused(
    ready: Coroutine[object, object, T], urls: Sequence[str], grace_s: float, *, endpoint: str, hint: str = ""
) -> T:
    """Await ``ready`` (a readiness wait on ``urls``), but when every url refuses TCP connections for
    ``grace_s`` seconds (``refused_throughout``) cancel it and raise; otherwise its result or error.

    Raises:
        EngineUnavailable: nothing listens at any of ``urls`` (naming them; ``hint`` ends the message).
    """
    waiter = asyncio.ensure_future(ready)
    watcher = asyncio.ensure_future(refused_throughout(urls, grace_s))
    try:
        await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done() and watcher.result():
            raise EngineUnavailable(
                f"connection refused (nothing listens there) at every probe for {grace_s:g}s: {', '.join(urls)}; "
                f"stopped waiting for {'it' if len(urls) == 1 else 'them'}{hint}",
                url=urls[0],
                endpoint=endpoint,
            )
        return await waiter
    finally:
        for task in (waiter, watcher):
            task.cancel()
        await asyncio.gather(waiter, watcher, return_exceptions=True)


async def failure_line(url: str, exc: EngineError) -> str:
    """``url: <error>`` for a failed control call; ``url: dead (...)`` when it could not connect and nothing
    listens at ``url`` now."""
    if isinstance(exc, EngineUnavailable) and await refuses_connections(url):
        return f"{url}: dead (connection refused: nothing listens there)"
    return await as_is(url, exc)


async def as_is(url: str, exc: EngineError) -> str:
    return f"{url}: {exc}"
