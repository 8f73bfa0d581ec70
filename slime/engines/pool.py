"""``HttpEnginePool``: several engines (or one router in front of them) behind one ``aiohttp.ClientSession``.

Routing for ``generate``, without a router: a ``sticky_key`` (one per trajectory, so the turns of a
conversation share the prefix cache) goes back to the engine it went to last while that engine is in
rotation with a closed breaker; otherwise the engine with the fewest in-flight generates wins
(engines with a recent failure last; ties: the one picked least often). With a router
(``router_url``) every ``generate`` goes to the router with header ``X-SMG-Routing-Key:
<sticky_key>``; sglang-router 0.3.2's ``--policy manual`` keeps a key on one worker (checked against
the wheel, tests/e2e/test_real_router.py; later ones also ``consistent_hashing``); others ignore it.

Engine failures: each worker has a ``CircuitBreaker`` (``breaker.py``); ``EngineUnavailable`` and
``EngineTimeout`` count against it, and the supervisor's health checks do. ``take_out`` removes a
worker from rotation (being restarted, it missed a weight update, its breaker opened); ``rejoin``
(``pool_control.py``) re-syncs it and puts it back. ``on_engine_down(url, reason)`` (set by
``EngineSupervisor``) hears of every breaker that opens. When a worker's breaker opens or it leaves
rotation, the generate attempts still on it end at once and are retried elsewhere (``pool_health.py``).

Retries (``RolloutConfig.max_retries``, ``retry_backoff_s``): an attempt that got no answer is
retried: a connection error or 5xx (``EngineUnavailable``), an engine that answered nothing within
``control_timeout_s`` of the abort at ``request_timeout_s``, or answered it with no token, or left
rotation meanwhile. The retry goes to a worker not yet tried in this call when there is one, after
``retry_backoff_s * 2**attempt`` seconds. Example, ``max_retries=2, retry_backoff_s=0.5``: try A,
fail, sleep 0.5, try B, fail, sleep 1.0, try A, fail -> ``EngineUnavailable("no answer after 3
attempts ... [A, B, A]")`` (``slime.rollout.generate`` marks the sample FAILED: it is not resumed for
ever). A resent request keeps its ``input_ids`` (prompt + partial response: the caller's sample only
changes on success) and its ``rid``, except after an attempt that may still be held by its engine (a
timeout): then ``<rid>t<n>-`` (SGLang refuses a duplicate rid; an abort of the rid still covers it).
With no worker in rotation a call waits up to ``rejoin_timeout_s`` for one (a restart), using no
attempt, then raises ``EnginesGone`` (one line naming each worker and why; at once when every worker
was given up on, ``retire``). ``abort_all`` ends calls that are between attempts or waiting: they
return a queued-abort result (no tokens, ``finish_reason`` abort, docs/sglang.md#abort, case B), so
the scheduler's drain never waits on a retry. An abort is never a failed attempt: a weight update's
abort resumes the sample token-exactly and costs it nothing.

Timeouts: at ``request_timeout_s`` the pool aborts the request by its ``rid`` (every worker, behind a
router) and SGLang answers it with its tokens so far (``finish_reason`` abort): the sample is PARTIAL
and resumes, nothing lost, the engine counted healthy. With no token in that answer it is a failed
attempt (nothing to resume from), not counted on the breaker. An engine that does not answer within
``control_timeout_s`` more is hung: a failed attempt, and a failure on its breaker, which opens after
``failure_threshold`` of them (``on_engine_down``: the supervisor restarts it). Example, defaults
(300 s, 60 s, K=3): a 400 s generation comes back PARTIAL at 300 s and resumes; a request on a wedged
engine is retried elsewhere at 360 s, and the engine is out after three (sooner by its health checks).
``give_up_inflight`` (the scheduler's drain, when ``abort_all`` went unheard) ends every call still on
an engine at once as an abort (the sample resumes) and takes that engine out of rotation.
Control calls: ``pool_control.py``. Not covered: the router's own retries (docs/sglang.md#router) add to ours;
health of the router itself (a dead router fails each call after its retries).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import aiohttp

from slime.config import RolloutConfig
from slime.engines.breaker import BreakerState, CircuitBreaker
from slime.engines.client import CONNECT_TIMEOUT_S, EngineClient
from slime.engines.pool_control import PoolControl
from slime.engines.pool_health import PoolEngine, PoolHealth, failure_text
from slime.engines.pool_timeouts import PoolTimeouts, aborted_result, counts_against_engine, may_still_run
from slime.engines.protocol import GenerateResult
from slime.errors import EngineError, EngineTimeout, EngineUnavailable

__all__ = ["HttpEnginePool", "ROUTING_KEY_HEADER"]

log = logging.getLogger(__name__)
ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
MAX_CONNECTIONS = 4096
"""Connector bound over all engines: room for thousands of concurrent generates (one socket each)."""
KEEPALIVE_S = 4.0
"""Below uvicorn's 5 s keep-alive, so we do not reuse a socket the server is about to close."""
_MAX_STICKY_KEYS = 65536  # least recently used keys are forgotten past this


class HttpEnginePool(PoolHealth, PoolTimeouts, PoolControl):
    """Workers at ``urls`` (and optionally the router at ``router_url``); an async context manager.

    Construct inside a running event loop (aiohttp's rule). A ``session`` passed in is used and left
    open; otherwise the pool creates one and ``close()`` (idempotent) closes it.

    Args:
        failure_threshold / breaker_cooldown_s: each worker's breaker (K, first cooldown; default
            cooldown ``retry_backoff_s * 2**max_retries``, the longest backoff of one retry chain).
        rejoin_timeout_s: how long ``generate`` waits when no worker is in rotation (0: fail at once).
        weights: ``(model_path, weight_version)`` the workers hold at start; ``rejoin`` syncs to the latest.

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
        router_url: str | None = None,
        failure_threshold: int = 3,
        breaker_cooldown_s: float | None = None,
        rejoin_timeout_s: float = 0.0,
        weights: tuple[str, str] | None = None,
    ):
        if not urls:
            raise ValueError("HttpEnginePool needs at least one engine url")
        self.config = config
        self.failure_threshold = failure_threshold
        self.breaker_cooldown_s = breaker_cooldown_s or max(config.retry_backoff_s * 2**config.max_retries, 1e-3)
        self.rejoin_timeout_s = rejoin_timeout_s
        self.weights = weights
        """``(model_path, weight_version)`` last sent to every worker (``update_weights_from_disk``)."""
        self.latest_version: str | None = weights[1] if weights else None
        """The newest ``weight_version`` pushed by any weight update (disk, tensor, distributed)."""
        self.kv_cache_version: str | None = weights[1] if weights else None
        """The ``weight_version`` at which every worker's prefix (radix) cache was last emptied, or None if
        unknown. KV computed by older weights survives an update without ``flush_cache`` (an in-place
        update, which must not flush: SGLang 0.5.17 dies on it), so a request that reuses cached KV
        (``cached_tokens > 0``) may depend on weights as old as this; ``generate`` tags its tokens no
        newer than it (docs/ARCHITECTURE.md, "In-place updates and the prefix cache")."""
        self.num_prefix_cache_hits = 0
        """Results with ``cached_tokens > 0`` since ``kv_cache_version`` was last set (0 on engines
        without a prefix cache, like the embedded one: no cache refresh is then needed)."""
        self.weights_lock = asyncio.Lock()  # held by weight updates and ``rejoin``: a rejoiner never misses one
        self.paused_mode: str | None = None
        self.on_engine_down: Callable[[str, str], None] | None = None
        self.num_failovers = 0  # generate attempts that got no answer (a retry followed, unless it was the last)
        self._api_key = api_key
        self._owns_session = session is None
        self._session = session or aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, limit_per_host=0, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
        )
        self._engines: dict[str, PoolEngine] = {}
        self._router = EngineClient(router_url, session=self._session, config=config, api_key=api_key) if router_url else None
        self._sticky: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._abort_epoch = 0
        self._abort_event = asyncio.Event()
        self._rotation_event = asyncio.Event()
        self._outage_logged = False
        self._diagnosis: asyncio.Future[tuple[str, dict[str, str]]] | None = None  # why every engine is out (``engines_gone``)
        self._attempts: dict[asyncio.Future[str], tuple[str, float]] = {}
        """Each generate attempt in flight: its give-up future (``give_up_inflight`` resolves it with the
        reason) -> (client url, loop time it started)."""
        self._closed = False
        for url in urls:
            self.add_engine(url)

    async def __aenter__(self) -> Self:
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
        """Every worker, in rotation or not."""
        return list(self._engines)

    @property
    def clients(self) -> list[EngineClient]:
        """Workers in rotation: the ones control calls and weight updates address."""
        return [e.client for e in self._engines.values() if e.in_rotation]

    @property
    def router_url(self) -> str | None:
        return self._router.url if self._router else None

    @property
    def num_inflight(self) -> int:
        """Generate calls in flight over all engines (and the router)."""
        return sum(e.client.num_inflight for e in self._engines.values()) + (self._router.num_inflight if self._router else 0)

    def add_engine(self, url: str) -> EngineClient:
        """Start routing to ``url``. Raises ValueError if it is already in the pool."""
        client = EngineClient(url, session=self._session, config=self.config, api_key=self._api_key)
        if client.url in self._engines:
            raise ValueError(f"engine {client.url} is already in the pool")
        breaker = CircuitBreaker(failure_threshold=self.failure_threshold, cooldown_s=self.breaker_cooldown_s)
        self._engines[client.url] = PoolEngine(client, breaker)
        return client

    def remove_engine(self, url: str) -> EngineClient:
        """Forget ``url`` for good; its in-flight calls finish normally. Raises KeyError if unknown."""
        return self._engine(url, pop=True).client

    def client(self, url: str) -> EngineClient:
        return self._engine(url).client

    def _engine(self, url: str, *, pop: bool = False) -> PoolEngine:
        key = url.rstrip("/")
        if key not in self._engines:
            raise KeyError(f"engine {key} is not in the pool (have {self.urls})")
        return self._engines.pop(key) if pop else self._engines[key]

    # -- generate --------------------------------------------------------------------------------

    def _pick(self, sticky_key: str | None, tried: set[str]) -> PoolEngine | None:
        rotation = [e for e in self._engines.values() if e.in_rotation]
        if not rotation:
            return None
        if sticky_key is not None and not tried:
            engine = self._engines.get(self._sticky.get(sticky_key, ""))
            if engine is not None and engine.in_rotation and engine.breaker.state is BreakerState.CLOSED:
                return engine
        candidates = [e for e in rotation if e.client.url not in tried] or rotation
        candidates = [e for e in candidates if e.breaker.available()] or candidates
        return min(candidates, key=lambda e: (e.breaker.num_consecutive_failures > 0, e.client.num_inflight, e.num_picks))

    async def _wait(self, event: asyncio.Event, timeout_s: float, abort_event: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(abort_event.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _pick_or_wait(self, sticky_key: str | None, tried: set[str], epoch: int, abort_event: asyncio.Event) -> PoolEngine | None:
        """A worker to try; None if ``abort_all`` came while waiting for one to rejoin.

        Raises:
            EnginesGone: no worker came back within ``rejoin_timeout_s``, or every one was given up on.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        while (engine := self._pick(sticky_key, tried)) is None:
            left = start + self.rejoin_timeout_s - loop.time()
            if not self._engines or left <= 0 or self.all_retired():
                raise await self.engines_gone(self.rejoin_timeout_s)
            if not self._outage_logged:  # once per outage: a wait is never silent, nor one line per request
                self._outage_logged = True
                log.warning("no engine in rotation: waiting up to %.0fs for one to come back (%s)", left, self._out_summary())
            await self._wait(self._rotation_event, left, abort_event)
            if self._abort_epoch != epoch:
                return None
        return engine

    def _out_summary(self) -> str:
        return "; ".join(f"{e.client.url}: {e.out_reason or e.last_failure or 'breaker open'}" for e in self._engines.values())

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        rid: str | None = None,
        return_logprob: bool = True,
        sticky_key: str | None = None,
        logprob_start_len: int | None = None,
    ) -> GenerateResult:
        """``EngineClient.generate`` on a chosen worker (or the router), retrying attempts that got no answer.

        Returns the engine's result; an abort result (``finish_reason`` abort, maybe no tokens) when
        the request was aborted (``abort_all``, a weight update: not counted, the sample resumes), or ran
        past ``request_timeout_s`` and the engine answered the abort with tokens (module docstring).

        Raises:
            EngineUnavailable: all ``max_retries + 1`` attempts got no answer (the message lists the urls tried).
            EnginesGone: no worker came back into rotation within ``rejoin_timeout_s`` (one line naming each).
            EngineRequestError / ProtocolError / ValueError: from the attempt, not retried.
        """
        self._check_open()
        epoch, abort_event = self._abort_epoch, self._abort_event
        attempts: list[str] = []
        last: EngineError | None = None
        resend_as = rid  # a retry after an attempt that may still run on its engine gets a new rid (SGLang refuses a duplicate)
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                await self._wait(asyncio.Event(), self.config.retry_backoff_s * 2 ** (attempt - 1), abort_event)
                if self._abort_epoch != epoch:
                    return aborted_result(rid, f"aborted while retrying after: {last}")
            engine, headers = None, None
            if self._router is not None:
                client = self._router
                headers = {ROUTING_KEY_HEADER: sticky_key} if sticky_key is not None else None
            else:
                engine = await self._pick_or_wait(sticky_key, set(attempts), epoch, abort_event)
                if engine is None:
                    return aborted_result(rid, "aborted while waiting for an engine to rejoin")
                client = engine.client
                engine.num_picks += 1
                engine.breaker.begin()
                if sticky_key is not None:  # bound now, so concurrent turns of one trajectory share an engine
                    self._bind_sticky(sticky_key, client.url)
            attempts.append(client.url)
            try:
                result = await self._bounded(
                    client,
                    input_ids,
                    sampling_params,
                    rid=resend_as,
                    return_logprob=return_logprob,
                    headers=headers,
                    logprob_start_len=logprob_start_len,
                )
            except (EngineUnavailable, EngineTimeout) as exc:  # no answer: counts against --max-retries
                if engine is not None and counts_against_engine(exc):
                    self.record_failure(client.url, failure_text(exc))  # "/generate: <why>"
                last = exc
                self.num_failovers += 1
                if rid and may_still_run(exc):
                    resend_as = f"{rid}t{attempt + 1}-"
                if self._abort_epoch != epoch:
                    return aborted_result(rid, f"aborted after: {exc}")
                continue
            if engine is not None:
                self.record_success(client.url)
            if result.cached_tokens:
                self.num_prefix_cache_hits += 1
            return result
        assert last is not None
        raise EngineUnavailable(
            f"no answer after {len(attempts)} attempts (--max-retries {self.config.max_retries}) against {attempts}; last error: {last}",
            url=last.url,
            endpoint="/generate",
            status=last.status,
            engine_message=last.engine_message,
        ) from last

    def _bind_sticky(self, key: str, url: str) -> None:
        self._sticky[key] = url
        self._sticky.move_to_end(key)
        if len(self._sticky) > _MAX_STICKY_KEYS:
            self._sticky.popitem(last=False)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("HttpEnginePool is closed")
