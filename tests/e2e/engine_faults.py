"""``FaultyProxy``: a real HTTP server in front of a real engine that can be made to fail on demand.

Modes, switched at any time with ``proxy.mode = ...``:

- ``"forward"``: every request goes to the engine behind it and its answer comes back unchanged.
- ``"stall"``: every request is accepted and never answered (a wedged engine: SIGSTOPped, a stuck GPU);
  requests already waiting inside the proxy stall too.
- ``"close"``: every request's connection is closed without an answer.

``proxy.fail_at(mode, n, path)`` switches to ``mode`` (or ``"kill"``) as the ``n``-th request (0-based)
to ``path`` arrives, so a fault can be placed at a point of the run (``n = 0`` on ``/generate``: the
first generate, the eval's; on ``/update_weights_from_disk``: the first weight sync). That request
gets the fault too.
``await proxy.kill()`` stops listening and drops every connection: from then on connections are
refused, as at the address of an engine whose process died. ``stalled`` counts the requests the
proxy is holding now.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

__all__ = ["FaultyProxy"]

Mode = Literal["forward", "stall", "close"]


class FaultyProxy:
    """Forwards to ``upstream`` (``http://host:port``) until told to fail; ``url`` once ``start`` returned."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.mode: Mode = "forward"
        self.stalled = 0
        self.num_requests: dict[str, int] = {}
        """path -> requests that arrived (forwarded or not)."""
        self._fail_at: tuple[str, int, Mode | Literal["kill"]] | None = None
        self.url = ""
        self._server: TestServer | None = None
        self._session: aiohttp.ClientSession | None = None
        self._never = asyncio.Event()

    async def __aenter__(self) -> FaultyProxy:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._server = TestServer(app, host="127.0.0.1")
        await self._server.start_server()
        self.url = f"http://127.0.0.1:{self._server.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()
        if self._session is not None:
            await self._session.close()

    async def kill(self) -> None:
        """Stop listening and drop every connection (later connects are refused). Idempotent."""
        self._never.set()  # frees the stalled handlers so the server can close
        if self._server is not None:
            server, self._server = self._server, None
            await server.close()

    def fail_at(self, mode: Mode | Literal["kill"], n: int = 0, path: str = "/generate") -> None:
        """Switch to ``mode`` (or kill) when the ``n``-th request (0-based) to ``path`` arrives."""
        self._fail_at = (path, n, mode)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen = self.num_requests[request.path] = self.num_requests.get(request.path, 0) + 1
        if self._fail_at is not None and self._fail_at[0] == request.path and seen > self._fail_at[1]:
            mode, self._fail_at = self._fail_at[2], None
            if mode == "kill":
                asyncio.get_running_loop().create_task(self.kill())
                return await self._stall(request)
            self.mode = mode
        if self.mode == "close":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)  # never reaches the client: the connection is gone
        if self.mode == "stall":
            return await self._stall(request)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            if self.mode == "stall":  # switched while the engine worked on it: the answer never leaves
                return await self._stall(request)
            return web.Response(body=payload, status=resp.status, content_type=resp.content_type)

    async def _stall(self, request: web.Request) -> web.StreamResponse:
        """Hold ``request`` unanswered until ``kill``, then drop its connection."""
        self.stalled += 1
        try:
            await self._never.wait()
        finally:
            self.stalled -= 1
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)  # never reaches the client: the connection is gone
