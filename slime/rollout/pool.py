"""``EnginePool``: several engines behind one ``aiohttp.ClientSession``, with routing and bounded retries.

Routing for ``generate``: a ``sticky_key`` (e.g. a group id, so a group's samples share the prefix
cache) goes back to the engine it went to last, while that engine is up; otherwise the engine with
the fewest in-flight generates wins (ties: the one picked least often so far).

Retries (``RolloutConfig.max_retries``, ``retry_backoff_s``): only ``EngineUnavailable`` is retried,
on an engine not yet tried in this call when there is one, after ``retry_backoff_s * 2**attempt``
seconds. Example, ``max_retries=2, retry_backoff_s=0.5``: try A, fail, sleep 0.5, try B, fail,
sleep 1.0, try A, fail -> ``EngineUnavailable("... 3 attempts ... [A, B, A]")``. ``EngineTimeout``
is not retried: the request may still be running on that engine, and a blind retry doubles the load.
A resent request keeps its ``rid``. An engine that failed is skipped (if others are up) for
``retry_backoff_s * 2**max_retries`` seconds, the longest backoff of one retry chain.

Control calls (abort, pause, weight update, ...) go to every engine concurrently; ``sglang-router``
forwards none of them, so the pool always addresses workers directly (§5.4 of sglang-protocol.md).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Awaitable, Callable, Literal, Mapping, Sequence

import aiohttp

from slime.config import RolloutConfig
from slime.errors import EngineError, EngineUnavailable
from slime.rollout.client import CONNECT_TIMEOUT_S, EngineClient
from slime.rollout.protocol import GenerateResult

__all__ = ["EnginePool"]

MAX_CONNECTIONS = 4096
"""Connector bound over all engines: room for thousands of concurrent generates (one socket each)."""
KEEPALIVE_S = 4.0
"""Below uvicorn's 5 s keep-alive, so we do not reuse a socket the server is about to close."""
_MAX_STICKY_KEYS = 65536  # least recently used keys are forgotten past this


class EnginePool:
    """Engines at ``urls``; an async context manager that owns one ``aiohttp.ClientSession``.

    Construct inside a running event loop (aiohttp's rule). A ``session`` passed in is used and left
    open; otherwise the pool creates one and ``close()`` (idempotent) closes it.

    Raises:
        ValueError: no urls, or a url given twice.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        config: RolloutConfig,
        session: aiohttp.ClientSession | None = None,
        api_key: str | None = None,
    ):
        if not urls:
            raise ValueError("EnginePool needs at least one engine url")
        self.config = config
        self._api_key = api_key
        self._owns_session = session is None
        self._session = session or aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
        )
        self._clients: dict[str, EngineClient] = {}
        self._num_picks: dict[str, int] = {}
        self._down_until: dict[str, float] = {}
        self._sticky: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._closed = False
        for url in urls:
            self.add_engine(url)

    async def __aenter__(self) -> "EnginePool":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the owned session (in-flight calls then fail with ``EngineUnavailable``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_session:
            await self._session.close()

    @property
    def urls(self) -> list[str]:
        return list(self._clients)

    @property
    def clients(self) -> list[EngineClient]:
        return list(self._clients.values())

    @property
    def num_inflight(self) -> int:
        """Generate calls in flight over all engines."""
        return sum(c.num_inflight for c in self._clients.values())

    def add_engine(self, url: str) -> EngineClient:
        """Start routing to ``url``. Raises ValueError if it is already in the pool."""
        client = EngineClient(url, session=self._session, config=self.config, api_key=self._api_key)
        if client.url in self._clients:
            raise ValueError(f"engine {client.url} is already in the pool")
        self._clients[client.url] = client
        self._num_picks[client.url] = 0
        return client

    def remove_engine(self, url: str) -> EngineClient:
        """Stop routing to ``url``; its in-flight calls finish normally. Raises KeyError if unknown."""
        key = url.rstrip("/")
        if key not in self._clients:
            raise KeyError(f"engine {key} is not in the pool (have {self.urls})")
        self._num_picks.pop(key)
        self._down_until.pop(key, None)
        return self._clients.pop(key)

    # -- generate --------------------------------------------------------------------------------

    def _is_up(self, url: str) -> bool:
        return self._down_until.get(url, 0.0) <= time.monotonic()

    def _pick(self, sticky_key: str | None, tried: set[str]) -> EngineClient:
        if not self._clients:
            raise EngineUnavailable("no engines in the pool", endpoint="/generate")
        if sticky_key is not None and not tried:
            url = self._sticky.get(sticky_key)
            if url in self._clients and self._is_up(url):
                return self._clients[url]
        candidates = [c for c in self._clients.values() if c.url not in tried] or list(self._clients.values())
        candidates = [c for c in candidates if self._is_up(c.url)] or candidates
        return min(candidates, key=lambda c: (c.num_inflight, self._num_picks[c.url]))

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        rid: str | None = None,
        return_logprob: bool = True,
        sticky_key: str | None = None,
    ) -> GenerateResult:
        """``EngineClient.generate`` on a chosen engine, retrying ``EngineUnavailable`` (module docstring).

        Raises:
            EngineUnavailable: all ``max_retries + 1`` attempts failed; the message lists the urls tried.
            EngineTimeout / EngineRequestError / ProtocolError / ValueError: from the attempt, not retried.
        """
        self._check_open()
        attempts: list[str] = []
        last: EngineUnavailable | None = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))
            client = self._pick(sticky_key, set(attempts))
            attempts.append(client.url)
            self._num_picks[client.url] += 1
            if sticky_key is not None:  # bound now, so a group's concurrent samples share one engine
                self._bind_sticky(sticky_key, client.url)
            try:
                result = await client.generate(input_ids, sampling_params, rid=rid, return_logprob=return_logprob)
            except EngineUnavailable as exc:
                last = exc
                if client.url in self._clients:
                    cooldown_s = self.config.retry_backoff_s * 2**self.config.max_retries
                    self._down_until[client.url] = time.monotonic() + cooldown_s
                continue
            self._down_until.pop(client.url, None)
            return result
        assert last is not None
        raise EngineUnavailable(
            f"gave up after {len(attempts)} attempts against {attempts}; last error: {last}",
            url=last.url, endpoint="/generate", status=last.status, engine_message=last.engine_message,
        ) from last

    def _bind_sticky(self, key: str, url: str) -> None:
        self._sticky[key] = url
        self._sticky.move_to_end(key)
        if len(self._sticky) > _MAX_STICKY_KEYS:
            self._sticky.popitem(last=False)

    # -- bulk control ----------------------------------------------------------------------------

    async def _fan_out(self, what: str, call: Callable[[EngineClient], Awaitable[Any]]) -> dict[str, Any]:
        """Run ``call`` on every engine concurrently; every engine is tried even if some fail.

        Returns ``{url: result}``. Raises the failures' common ``EngineError`` class (else
        ``EngineError``) naming every failed engine; a non-engine exception (a bug) propagates as is.
        """
        self._check_open()
        clients = list(self._clients.values())
        outcomes = await asyncio.gather(*(call(c) for c in clients), return_exceptions=True)
        failed = [(c, o) for c, o in zip(clients, outcomes) if isinstance(o, BaseException)]
        for _, exc in failed:
            if not isinstance(exc, EngineError):
                raise exc
        if failed:
            first = failed[0][1]
            classes = {type(exc) for _, exc in failed}
            cls = classes.pop() if len(classes) == 1 else EngineError
            lines = "; ".join(f"{c.url}: {exc}" for c, exc in failed)
            raise cls(
                f"{what} failed on {len(failed)} of {len(clients)} engines: {lines}",
                url=first.url, endpoint=first.endpoint, status=first.status, engine_message=first.engine_message,
            ) from first
        return {c.url: o for c, o in zip(clients, outcomes)}

    async def abort_all(self) -> dict[str, None]:
        """``POST /abort_request {"abort_all": true}`` on every engine (§3.1)."""
        return await self._fan_out("abort_all", lambda c: c.abort(abort_all=True))

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> dict[str, None]:
        return await self._fan_out(f"pause_generation({mode})", lambda c: c.pause_generation(mode))

    async def continue_generation(self) -> dict[str, None]:
        return await self._fan_out("continue_generation", lambda c: c.continue_generation())

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str, *, abort_all_requests: bool = False, flush_cache: bool = True
    ) -> dict[str, dict[str, Any]]:
        """Every engine loads ``model_path`` (§3.8). Returns ``{url: {"success", "message", ...}}``.

        Raises:
            EngineRequestError (or another EngineError): naming each engine that reported failure.
        """
        return await self._fan_out(
            f"update_weights_from_disk({model_path!r}, weight_version={weight_version!r})",
            lambda c: c.update_weights_from_disk(
                model_path, weight_version=weight_version, abort_all_requests=abort_all_requests, flush_cache=flush_cache
            ),
        )

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
                                              **kwargs: Any) -> dict[str, dict[str, Any]]:
        """Every engine receives one bucket over the weights-update group (§3.10); ``kwargs`` as
        ``EngineClient.update_weights_from_distributed``. The caller broadcasts concurrently."""
        return await self._fan_out(f"update_weights_from_distributed({len(names)} tensors)",
                                   lambda c: c.update_weights_from_distributed(names, dtypes, shapes, **kwargs))

    async def update_weights_from_tensor(self, serialized_named_tensors: Sequence[str], **kwargs: Any) -> dict[str, dict[str, Any]]:
        """Every engine loads the same payload (§3.9); ``kwargs`` as ``EngineClient.update_weights_from_tensor``."""
        return await self._fan_out("update_weights_from_tensor", lambda c: c.update_weights_from_tensor(serialized_named_tensors, **kwargs))

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]:
        """Every engine frees ``tags`` (None = all) for a colocated trainer (§3.11); engines must be idle."""
        return await self._fan_out("release_memory_occupation", lambda c: c.release_memory_occupation(tags))

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]:
        """Every engine re-maps ``tags`` (§3.11); released weights must be synced again afterwards."""
        return await self._fan_out("resume_memory_occupation", lambda c: c.resume_memory_occupation(tags))

    async def flush_cache(self) -> dict[str, bool]:
        """``{url: flushed}``; False where the engine was busy (§3.3)."""
        return await self._fan_out("flush_cache", lambda c: c.flush_cache())

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until every engine answers ``/health_generate`` 200; marks them up. Raises as ``EngineClient.wait_ready``."""
        await self._fan_out("wait_ready", lambda c: c.wait_ready(timeout_s))
        self._down_until.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("EnginePool is closed")
