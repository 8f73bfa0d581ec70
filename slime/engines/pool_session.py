"""The ``aiohttp.ClientSession`` of engine calls: how it is made (``new_session``) and who closes it (``PoolSession``).

One session per pool (or per run, shared by the fleet's startup and its pools) talks to every engine
and router: its connector is bounded over all of them (``MAX_CONNECTIONS``), never per host, and keeps
idle sockets for less time than uvicorn does (``KEEPALIVE_S``); only connecting has a session-wide
deadline (``CONNECT_TIMEOUT_S``), each call sets its own (``EngineHttp``).
"""

from __future__ import annotations

import aiohttp

from slime.engines.client import CONNECT_TIMEOUT_S

__all__ = ["new_session", "PoolSession", "MAX_CONNECTIONS", "KEEPALIVE_S"]

MAX_CONNECTIONS = 4096
"""Connector bound over all engines: room for thousands of concurrent generates (one socket each)."""
KEEPALIVE_S = 4.0
"""Below uvicorn's 5 s keep-alive, so we do not reuse a socket the server is about to close."""


def new_session() -> aiohttp.ClientSession:
    """A session for engine calls (construct it inside a running event loop: aiohttp's rule); the caller closes it."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
    )


class PoolSession:
    """The session ``owner`` (``"HttpEnginePool"``) calls through, and whether it is closed.

    A ``session`` passed in is used and left open by ``close``; otherwise a ``new_session()`` is made
    (inside a running event loop) and ``close`` closes it.
    """

    def __init__(self, session: aiohttp.ClientSession | None, *, owner: str):
        self.owns_session = session is None
        self.session = session or new_session()
        self.closed = False
        self._owner = owner

    async def close(self) -> None:
        """Mark closed and close the owned session (in-flight calls then fail). Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.owns_session:
            await self.session.close()

    def check_open(self) -> None:
        """Raises RuntimeError once ``close`` was called."""
        if self.closed:
            raise RuntimeError(f"{self._owner} is closed")
