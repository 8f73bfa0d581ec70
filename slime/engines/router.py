"""``RouterClient``: sglang-router's worker-management and readiness endpoints (docs/sglang.md#router).

Which router versions answer what (docs/sglang.md#router), and what we do:

    list     GET /workers -> {"workers": [{"url", "id"?, ...}]}; 404 -> GET /list_workers -> {"urls": [...]}
    add      POST /workers {"url", "worker_type"?, "bootstrap_port"?} -> 200, or 202 (0.3.x registers
             asynchronously); 404/405 -> POST /add_worker?url=U (legacy, <= 0.2.1)
    remove   DELETE /workers/{id} (0.3.x, id from the listing) or /workers/{url-quoted} (early REST);
             404/405 on both -> POST /remove_worker?url=U (legacy)
    ready    GET /readiness == 200 (healthy workers > 0); 404 -> GET /health == 200 (router liveness)

``/generate`` goes through the router with ``EngineClient.generate`` (this class is one); control
calls never do (docs/sglang.md#router). Not verified against a running router: the bodies above come from the
protocol notes (wheel 0.3.2 strings and public sources), and the ⚠ there apply (e.g. whether the
legacy ``/add_worker`` waits for the worker to be healthy).
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from typing import Any, TypedDict

from slime.engines.client import EngineClient
from slime.errors import EngineRequestError, EngineTimeout, EngineUnavailable, ProtocolError
from slime.types import JsonObject

__all__ = ["RouterClient", "WorkerRegistration"]

_NOT_HERE = (404, 405)


class WorkerRegistration(TypedDict, total=False):
    """What ``add_worker`` sends beside the url for a PD worker (a regular one sends neither)."""

    worker_type: str
    bootstrap_port: int


class RouterClient(EngineClient):
    """A router at ``url``; the constructor is ``EngineClient``'s."""

    async def list_workers(self) -> list[JsonObject]:
        """Registered workers as ``[{"url": ..., "id"?: ..., ...}]`` (legacy routers give only urls).

        Raises:
            ProtocolError: a listing of an unknown shape. EngineError: as ``EngineClient``.
        """
        try:
            body = await self._http.call("GET", "/workers")
            key = "workers"
        except EngineRequestError as exc:
            if exc.status not in _NOT_HERE:
                raise
            body, key = await self._http.call("GET", "/list_workers"), "urls"
        rows = body.get(key) if isinstance(body, dict) else None
        if not isinstance(rows, list):
            raise ProtocolError(
                f"expected {{{key!r}: [...]}} from the worker listing, got {str(body)[:200]!r}",
                url=self.url,
                endpoint=f"/{key}",
            )
        workers = [{"url": r} if isinstance(r, str) else r for r in rows]
        if not all(isinstance(w, dict) and isinstance(w.get("url"), str) for w in workers):
            raise ProtocolError(f"worker entries without a url: {str(rows)[:200]!r}", url=self.url, endpoint="/workers")
        return workers

    async def worker_urls(self) -> list[str]:
        return [w["url"].rstrip("/") for w in await self.list_workers()]

    async def add_worker(self, url: str, *, worker_type: str | None = None, bootstrap_port: int | None = None) -> None:
        """Register ``url`` (idempotent: "already exists" answers are accepted)."""
        body: dict[str, Any] = {"url": url}
        if worker_type is not None:
            body["worker_type"] = worker_type
        if bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
        try:
            await self._http.call("POST", "/workers", body)
        except EngineRequestError as exc:
            if exc.status in _NOT_HERE:
                await self._legacy("/add_worker", url)
            elif "exist" not in exc.engine_message.lower():
                raise

    async def remove_worker(self, url: str) -> None:
        """Deregister ``url``; a worker the router does not know is not an error."""
        try:
            workers = {w["url"].rstrip("/"): w for w in await self.list_workers()}
        except EngineRequestError:
            workers = {}
        entry = workers.get(url.rstrip("/"))
        if workers and entry is None:
            return
        key = str(entry.get("id") or url) if entry else url
        try:
            await self._http.call("DELETE", "/workers/" + urllib.parse.quote(key, safe=""))
        except EngineRequestError as exc:
            if exc.status not in _NOT_HERE:
                raise
            await self._legacy("/remove_worker", url)

    async def _legacy(self, endpoint: str, url: str) -> None:
        """Legacy routes answer plain text (200 ok, 400 error); ``_call`` would try to decode JSON."""
        path = f"{endpoint}?url={urllib.parse.quote(url, safe='')}"
        reply = await self._http.send("POST", path, timeout_s=self.config.control_timeout_s)
        if reply.status == 400 and "exist" in reply.text.lower():
            return
        self._http.raise_for_status(reply, endpoint)

    async def wait_ready(self, timeout_s: float) -> None:
        """Poll ``GET /readiness`` (``/health`` on routers without it) until 200.

        Raises:
            EngineUnavailable: never reached the router. EngineTimeout: reached it, never ready.
        """
        deadline = time.monotonic() + timeout_s
        endpoint, last, reached = "/readiness", "no probe sent", False
        while (left := deadline - time.monotonic()) > 0:
            try:
                reply = await self._http.send("GET", endpoint, timeout_s=min(left, self.config.control_timeout_s))
            except EngineUnavailable as exc:
                last = f"unreachable ({exc.engine_message})"
            except EngineTimeout:
                reached, last = True, "probe timed out"
            else:
                reached, last = True, f"HTTP {reply.status} from {endpoint}"
                if reply.status == 200:
                    return
                if reply.status == 404 and endpoint == "/readiness":
                    endpoint = "/health"
                    continue
            await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        cls = EngineTimeout if reached else EngineUnavailable
        raise cls(f"router not ready after {timeout_s}s (last: {last})", url=self.url, endpoint=endpoint)
