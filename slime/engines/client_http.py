"""``EngineHttp``: one engine's HTTP exchanges, with SGLang's errors mapped once (``slime/errors.py``).

    connection refused / reset / ServerDisconnected / connect timeout / 5xx -> EngineUnavailable
    the call ran past its deadline                                          -> EngineTimeout
    4xx, or a 200 with ``"success": false``                                 -> EngineRequestError
    a body we cannot decode                                                 -> ProtocolError

Each carries ``url``, ``endpoint``, ``status`` and the engine's own words (``engine_message``, via
``error_message_from_body``). ``EngineClient`` (``client.py``) builds the calls on top; the session
belongs to the ``HttpEnginePool`` (or the caller).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
import msgspec

from slime.config import RolloutConfig
from slime.engines.protocol import error_message_from_body
from slime.errors import EngineRequestError, EngineTimeout, EngineUnavailable, ProtocolError
from slime.types import JsonObject

__all__ = ["EngineHttp", "Reply", "CONNECT_TIMEOUT_S"]

CONNECT_TIMEOUT_S = 10.0
"""TCP connect bound inside every call; a connect timeout means the request was never sent, so it is
``EngineUnavailable`` (safe to retry elsewhere), unlike a read that runs past the call's deadline."""
_JSON_HEADERS = {"Content-Type": "application/json"}


class Reply(msgspec.Struct):
    """One HTTP answer as it came: status, content type and body bytes."""

    status: int
    content_type: str
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class EngineHttp:
    """HTTP to the engine at ``url`` through ``session``; ``api_key`` is sent as ``Authorization: Bearer``."""

    def __init__(self, url: str, *, session: aiohttp.ClientSession, config: RolloutConfig, api_key: str | None = None):
        self.url = url
        self.config = config
        self._session = session
        self._headers = dict(_JSON_HEADERS)
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    async def send(
        self,
        method: str,
        endpoint: str,
        *,
        body: object = None,
        timeout_s: float,
        raw: bytes | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """One HTTP exchange; raises only EngineUnavailable / EngineTimeout / ProtocolError (any status comes back).
        ``body``: JSON-encodable (msgspec). ``raw``: send these bytes as ``application/octet-stream`` instead.
        ``extra_headers``: added to this request only (e.g. the router's routing key)."""
        data = raw if raw is not None else None if body is None else msgspec.json.encode(body)
        headers = self._headers if raw is None else {**self._headers, "Content-Type": "application/octet-stream"}
        if extra_headers:
            headers = {**headers, **extra_headers}
        client_timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, CONNECT_TIMEOUT_S))
        url = self.url
        try:
            async with asyncio.timeout(timeout_s):
                async with self._session.request(
                    method, url + endpoint, data=data, headers=headers, timeout=client_timeout
                ) as resp:
                    return Reply(resp.status, resp.content_type, await resp.read())
        except aiohttp.ConnectionTimeoutError as exc:
            raise EngineUnavailable(
                f"connect timed out after {CONNECT_TIMEOUT_S}s", engine_message=str(exc), url=url, endpoint=endpoint
            ) from exc
        except TimeoutError as exc:
            raise EngineTimeout(f"{method} timed out after {timeout_s}s", url=url, endpoint=endpoint) from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise EngineUnavailable(
                f"connection failed: {type(exc).__name__}: {exc}", engine_message=str(exc), url=url, endpoint=endpoint
            ) from exc
        except aiohttp.ClientResponseError as exc:  # malformed HTTP from the peer
            raise ProtocolError(
                f"bad HTTP response: {exc}", engine_message=str(exc), url=url, endpoint=endpoint
            ) from exc

    def raise_for_status(self, reply: Reply, endpoint: str) -> None:
        """Raise for a 4xx (``EngineRequestError``) or 5xx (``EngineUnavailable``) with the engine's message."""
        if reply.status < 400:
            return
        message = error_message_from_body(reply.status, reply.content_type, reply.text)
        cls = EngineUnavailable if reply.status >= 500 else EngineRequestError
        raise cls(message, url=self.url, endpoint=endpoint, status=reply.status, engine_message=message)

    def decode_json(self, reply: Reply, endpoint: str) -> object:
        """A 2xx body as JSON; an empty body is None (``/abort_request`` answers 200 with nothing, docs/sglang.md#abort)."""
        if not reply.body.strip():
            return None
        try:
            decoded: object = msgspec.json.decode(reply.body)
        except msgspec.DecodeError as exc:
            raise ProtocolError(
                f"undecodable JSON body ({exc}): {reply.text[:300]!r}",
                url=self.url,
                endpoint=endpoint,
                status=reply.status,
            ) from exc
        return decoded

    async def call(
        self,
        method: str,
        endpoint: str,
        body: object = None,
        *,
        timeout_s: float | None = None,
        raw: bytes | None = None,
    ) -> Any:  # the engine's JSON as decoded, of whatever shape it sent (None for an empty body)
        """Control call: JSON (or ``raw`` bytes) in, JSON out; 4xx/5xx and ``"success": false`` raise
        (docs/sglang.md#errors). ``timeout_s`` None: ``control_timeout_s``."""
        reply = await self.send(
            method, endpoint, body=body, timeout_s=timeout_s or self.config.control_timeout_s, raw=raw
        )
        self.raise_for_status(reply, endpoint)
        result = self.decode_json(reply, endpoint)
        if isinstance(result, dict) and result.get("success") is False:
            message = error_message_from_body(reply.status, reply.content_type, reply.text)
            raise EngineRequestError(
                message, url=self.url, endpoint=endpoint, status=reply.status, engine_message=message
            )
        return result

    async def call_object(
        self,
        method: str,
        endpoint: str,
        body: object = None,
        *,
        timeout_s: float | None = None,
        raw: bytes | None = None,
    ) -> JsonObject:
        """``call`` whose answer must be a JSON object.

        Raises:
            ProtocolError: the answer is not a JSON object. And as ``call``.
        """
        result = await self.call(method, endpoint, body, timeout_s=timeout_s, raw=raw)
        if not isinstance(result, dict):
            raise ProtocolError(
                f"expected a JSON object, got {type(result).__name__}", url=self.url, endpoint=endpoint, status=200
            )
        return result

    async def get_with_fallback(self, endpoint: str, legacy: str) -> JsonObject:
        """``GET endpoint``, or ``GET legacy`` when that answers 404 (an older SGLang); a JSON object."""
        try:
            return await self.call_object("GET", endpoint)
        except EngineRequestError as exc:
            if exc.status != 404:
                raise
        return await self.call_object("GET", legacy)
