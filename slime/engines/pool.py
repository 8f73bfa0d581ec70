"""``HttpEnginePool``: several engines (or one router in front of them) behind one ``aiohttp.ClientSession``.

The pool is assembled from parts, each with explicit constructor arguments: ``Workers`` (``pool_workers.py``:
the workers, their breakers, rotation and routing), ``Attempts`` (``pool_timeouts.py``: each generate
attempt's time bounds; ``AbortSignal``: ``abort_all`` as the waiting calls see it), ``Dispatch``
(``pool_dispatch.py``: one generate, attempt by attempt), ``PoolSession`` (``pool_session.py``: the
``aiohttp`` session, owned or not) and ``PoolControl`` (``pool_control.py``: control calls, weight state,
rejoin). This class assembles them and gives the rest of slime one object (``WorkerPool``).

Routing for ``generate``, without a router: a ``sticky_key`` (one per trajectory, so the turns of a
conversation share the prefix cache) goes back to its engine (``Workers.pick``). With a router
(``router_url``) every ``generate`` goes to the router with header ``X-SMG-Routing-Key:
<sticky_key>``; sglang-router 0.3.2's ``--policy manual`` keeps a key on one worker (checked against
the wheel, tests/e2e/test_real_router.py; later ones also ``consistent_hashing``); others ignore it.

Engine failures: each worker has a ``CircuitBreaker`` (``breaker.py``); ``EngineUnavailable`` and
``EngineTimeout`` count against it, and the supervisor's health checks do. ``take_out`` removes a
worker from rotation (being restarted, it missed a weight update, its breaker opened); ``rejoin``
(``pool_control.py``) re-syncs it and puts it back. ``on_engine_down(url, reason)`` (set by
``EngineSupervisor``) hears of every breaker that opens. When a worker's breaker opens or it leaves
rotation, the generate attempts still on it end at once and are retried elsewhere (``pool_workers.py``).

Retries (``RolloutConfig.max_retries``, ``retry_backoff_s``) of an attempt that got no answer, with
an example: ``pool_dispatch.py``. Timeouts (``request_timeout_s``, ``control_timeout_s``) and
``give_up_inflight``: ``pool_timeouts.py``.
Control calls: ``pool_control.py``. Not covered: the router's own retries (docs/sglang.md#router) add to ours;
health of the router itself (a dead router fails each call after its retries).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Self

import aiohttp

from slime.config import RolloutConfig
from slime.engines.client import EngineClient
from slime.engines.interface import PauseMode
from slime.engines.pool_control import PoolControl
from slime.engines.pool_dispatch import ROUTING_KEY_HEADER, Dispatch
from slime.engines.pool_session import PoolSession
from slime.engines.pool_timeouts import AbortSignal, Attempts
from slime.engines.pool_workers import EngineState, Workers
from slime.engines.protocol import GenerateResult
from slime.types import JsonObject

__all__ = ["HttpEnginePool", "ROUTING_KEY_HEADER"]


class HttpEnginePool:
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
        self._api_key = api_key
        self._http = PoolSession(session, owner="HttpEnginePool")
        self._session = self._http.session
        self._router = (
            EngineClient(router_url, session=self._session, config=config, api_key=api_key) if router_url else None
        )
        self._abort = AbortSignal()
        self._attempts = Attempts(config, abort_rid=self._abort_rid)
        cooldown_s = breaker_cooldown_s or max(config.retry_backoff_s * 2**config.max_retries, 1e-3)
        self._workers = Workers(
            failure_threshold=failure_threshold,
            breaker_cooldown_s=cooldown_s,
            rejoin_timeout_s=rejoin_timeout_s,
            end_attempts=self._attempts.end,
        )
        self._control = PoolControl(self._workers, abort=self._abort, check_open=self._check_open, weights=weights)
        self._dispatch = Dispatch(
            config,
            self._workers,
            self._attempts,
            abort=self._abort,
            router=self._router,
            note_cache_hit=self._control.note_cache_hit,
        )
        for url in urls:
            self.add_engine(url)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the owned session (in-flight calls then fail with ``EngineUnavailable``). Idempotent."""
        await self._http.close()

    def _check_open(self) -> None:
        self._http.check_open()

    # -- workers ---------------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Every worker, in rotation or not."""
        return self._workers.urls

    @property
    def clients(self) -> list[EngineClient]:
        """Workers in rotation: the ones control calls and weight updates address."""
        return self._workers.clients

    @property
    def router_url(self) -> str | None:
        return self._router.url if self._router else None

    @property
    def num_inflight(self) -> int:
        """Generate calls in flight over all engines (and the router)."""
        return self._workers.num_inflight + (self._router.num_inflight if self._router else 0)

    def add_engine(self, url: str) -> EngineClient:
        """Start routing to ``url``. Raises ValueError if it is already in the pool."""
        client = EngineClient(url, session=self._session, config=self.config, api_key=self._api_key)
        self._workers.add(client)
        return client

    def remove_engine(self, url: str) -> EngineClient:
        """Forget ``url`` for good; its in-flight calls finish normally. Raises KeyError if unknown."""
        return self._workers.get(url, pop=True).client

    def client(self, url: str) -> EngineClient:
        """The worker at ``url``, in rotation or not. Raises KeyError if unknown."""
        return self._workers.get(url).client

    # -- health (the supervisor's calls) -----------------------------------------------------------

    @property
    def on_engine_down(self) -> Callable[[str, str], None] | None:
        """Hears ``(url, reason)`` of every breaker that opens and every worker taken out (set by the supervisor)."""
        return self._workers.on_engine_down

    @on_engine_down.setter
    def on_engine_down(self, callback: Callable[[str, str], None] | None) -> None:
        self._workers.on_engine_down = callback

    def engine_states(self) -> list[EngineState]:
        """One JSON-able row per worker: url, in_rotation, out_reason, breaker state, consecutive failures,
        in flight, picks, last_failure, retired (``EngineState``)."""
        return self._workers.states()

    def record_success(self, url: str) -> None:
        """``url`` answered: close its breaker, forget its last failure."""
        self._workers.record_success(url)

    def record_failure(self, url: str, reason: str) -> None:
        """Count a failure of ``url``; if its breaker opens, end its generate attempts and tell ``on_engine_down``."""
        self._workers.record_failure(url, reason)

    def note_failure(self, url: str, reason: str) -> None:
        """Remember ``reason`` as ``url``'s latest failure without counting it (a probe of an engine already out)."""
        self._workers.note_failure(url, reason)

    def trip(self, url: str, reason: str) -> None:
        """Open ``url``'s breaker now (its process exited); its generate attempts end at once."""
        self._workers.trip(url, reason)

    def retire(self, url: str, reason: str) -> None:
        """Out of rotation for the rest of the run (the supervisor gave up on it): generates stop waiting for it."""
        self._workers.retire(url, reason)

    def take_out(self, url: str, reason: str) -> bool:
        """Stop routing to ``url`` until ``rejoin`` (its attempts are retried elsewhere); False if already out."""
        return self._workers.take_out(url, reason)

    async def rejoin(self, url: str) -> None:
        """Re-sync ``url``'s weights and put it back in rotation (``PoolControl.rejoin``, which says what raises)."""
        await self._control.rejoin(url)

    def give_up_inflight(self, reason: str, *, running_for_s: float = 0.0) -> list[str]:
        """End every generate attempt that has been on an engine for ``running_for_s`` seconds or more
        (the scheduler's drain: its ``abort_all`` went unheard, the engine is hung).

        Each ends with an abort result with no tokens (its sample stays resumable); each worker that
        held one is taken out of rotation (``on_engine_down``: the supervisor restarts or watches it).
        Younger attempts (sent after the drain began) are left alone. Returns the urls of those
        workers (and of the router, whose calls end the same way), in pool order.
        """
        urls = self._attempts.give_up(reason, running_for_s=running_for_s)
        for url in urls:
            if url in self._workers:
                self._workers.take_out(url, f"generate requests given up: {reason}")
        return urls

    async def wait_ready(
        self, timeout_s: float, *, refused_grace_s: float | None = None, refused_hint: str = ""
    ) -> None:
        """Wait until every worker answers ``/health_generate`` 200 (``PoolControl.wait_ready``, which says
        what ``refused_grace_s`` does and what raises)."""
        await self._control.wait_ready(timeout_s, refused_grace_s=refused_grace_s, refused_hint=refused_hint)

    # -- weight state (``PoolControl`` keeps it; tests and the supervisor read and set it here) ------

    @property
    def weights(self) -> tuple[str, str] | None:
        """``(model_path, weight_version)`` last sent to every worker (``update_weights_from_disk``)."""
        return self._control.weights

    @weights.setter
    def weights(self, value: tuple[str, str] | None) -> None:
        self._control.weights = value

    @property
    def latest_version(self) -> str | None:
        """The newest ``weight_version`` pushed by any weight update (disk, tensor, distributed)."""
        return self._control.latest_version

    @latest_version.setter
    def latest_version(self, value: str | None) -> None:
        self._control.latest_version = value

    @property
    def kv_cache_version(self) -> str | None:
        """The version every worker's prefix cache was last emptied at, None if unknown (``PoolControl``)."""
        return self._control.kv_cache_version

    @property
    def num_prefix_cache_hits(self) -> int:
        """Results with ``cached_tokens > 0`` since ``kv_cache_version`` was last set."""
        return self._control.num_prefix_cache_hits

    @num_prefix_cache_hits.setter
    def num_prefix_cache_hits(self, value: int) -> None:
        self._control.num_prefix_cache_hits = value

    @property
    def paused_mode(self) -> PauseMode | None:
        """The mode of the pause in force (``pause_generation``), None while generating."""
        return self._control.paused_mode

    @paused_mode.setter
    def paused_mode(self, value: PauseMode | None) -> None:
        self._control.paused_mode = value

    @property
    def memory_released(self) -> bool:
        """Between ``release_memory_occupation`` and ``resume_memory_occupation`` (no health probes then)."""
        return self._control.memory_released

    @property
    def weights_lock(self) -> asyncio.Lock:
        """Held by weight updates and ``rejoin``: a rejoiner never misses one."""
        return self._control.weights_lock

    # -- control calls (every worker in rotation; ``pool_control.py``) ------------------------------

    async def abort_all(self) -> dict[str, None]:
        """Abort every request on every worker, and the pool's calls between retries (``PoolControl.abort_all``)."""
        return await self._control.abort_all()

    async def pause_generation(self, mode: PauseMode = "abort") -> dict[str, None]:
        """Every worker pauses (docs/sglang.md#pause); a worker that rejoins before ``continue_generation`` is paused too."""
        return await self._control.pause_generation(mode)

    async def continue_generation(self) -> dict[str, None]:
        return await self._control.continue_generation()

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str, *, abort_all_requests: bool = False, flush_cache: bool = True
    ) -> dict[str, JsonObject]:
        """Every worker loads ``model_path``; ``{url: reply}`` (``PoolControl.update_weights_from_disk``)."""
        return await self._control.update_weights_from_disk(
            model_path, weight_version, abort_all_requests=abort_all_requests, flush_cache=flush_cache
        )

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        *,
        group_name: str,
        weight_version: str,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
        load_format: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, JsonObject]:
        """Every worker receives one bucket over NCCL (``PoolControl.update_weights_from_distributed``)."""
        return await self._control.update_weights_from_distributed(
            names, dtypes, shapes, group_name=group_name, weight_version=weight_version,
            abort_all_requests=abort_all_requests, flush_cache=flush_cache, load_format=load_format, timeout_s=timeout_s,
        )  # fmt: skip

    async def update_weights_from_tensor(
        self,
        serialized_named_tensors: Sequence[str],
        *,
        weight_version: str,
        load_format: str | None = None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
        timeout_s: float | None = None,
    ) -> dict[str, JsonObject]:
        """Every worker loads the same payload (``PoolControl.update_weights_from_tensor``)."""
        return await self._control.update_weights_from_tensor(
            serialized_named_tensors,
            weight_version=weight_version,
            load_format=load_format,
            abort_all_requests=abort_all_requests,
            flush_cache=flush_cache,
            timeout_s=timeout_s,
        )

    def weight_update(self, weight_version: str, *, flush_cache: bool) -> AbstractAsyncContextManager[None]:
        """A sync that sends to each worker itself, with the pool's weight state kept (``PoolControl.weight_update``)."""
        return self._control.weight_update(weight_version, flush_cache=flush_cache)

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]:
        """Every worker frees ``tags`` (None = all) for a colocated trainer (docs/sglang.md#memory); workers must be idle."""
        return await self._control.release_memory_occupation(tags)

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]:
        """Every worker re-maps ``tags`` (docs/sglang.md#memory); released weights must be synced again afterwards."""
        return await self._control.resume_memory_occupation(tags)

    async def flush_cache(self) -> dict[str, bool]:
        """``{url: flushed}``; False where the worker was busy (``PoolControl.flush_cache``)."""
        return await self._control.flush_cache()

    # -- generate (``pool_dispatch.py``) ------------------------------------------------------------

    @property
    def num_failovers(self) -> int:
        """Generate attempts that got no answer (a retry followed, unless it was the last)."""
        return self._dispatch.num_failovers

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, object],
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
        ``sampling_params``: SGLang's JSON sampling parameters (any values).

        Raises:
            EngineUnavailable: all ``max_retries + 1`` attempts got no answer (the message lists the urls tried).
            EnginesGone: no worker came back into rotation within ``rejoin_timeout_s`` (one line naming each).
            EngineRequestError / ProtocolError / ValueError: from the attempt, not retried.
        """
        self._check_open()
        return await self._dispatch.generate(
            input_ids,
            sampling_params,
            rid=rid,
            return_logprob=return_logprob,
            sticky_key=sticky_key,
            logprob_start_len=logprob_start_len,
        )

    async def _abort_rid(self, client: EngineClient, rid: str) -> None:
        """Abort ``rid`` where it runs: on ``client``, or behind a router on every worker (the router does
        not forward ``/abort_request``). Best effort: an engine that does not answer is found hung anyway."""
        targets = self.clients if client is self._router else [client]
        await asyncio.gather(*(c.abort(rid) for c in targets), return_exceptions=True)
