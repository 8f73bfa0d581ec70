"""``PoolControl``: the control calls of ``HttpEnginePool``, the weights its workers hold, and ``rejoin``.

Each control call goes to every worker in rotation, concurrently. ``PoolControl`` keeps what the
workers hold: the latest ``weight_version``, the checkpoint on disk for rejoins, the version their
prefix caches were last emptied at and the cache hits since, the pause mode, whether memory is released.

sglang-router forwards none of them (docs/sglang.md#router), so even behind a router the pool
addresses workers directly. What an unreachable worker (``EngineUnavailable`` / ``EngineTimeout``)
does to each call:

    abort_all, pause/continue, flush_cache, release/resume memory   skipped, counted on its breaker
    update_weights_from_disk                                         taken out of rotation (it missed
                                                                     the update; ``rejoin`` re-syncs it)
    update_weights_from_tensor / _from_distributed                   taken out of rotation, and raised
                                                                     (the broadcast is out of step)
    wait_ready                                                       raised

Any other ``EngineError`` (a 4xx, ``success: false``) is raised, naming every engine that failed.
Not covered: a worker out of rotation gets no control call at all (a hung one keeps its requests
until the supervisor restarts it); ``rejoin`` replays only disk weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Literal, TypeVar

from slime.engines.client import EngineClient
from slime.engines.interface import PauseMode
from slime.engines.pool_timeouts import AbortSignal
from slime.engines.pool_workers import Workers
from slime.engines.probe import as_is, failure_line, wait_unless_refused
from slime.errors import EngineError, EngineRequestError, EngineTimeout, EngineUnavailable
from slime.types import JsonObject

__all__ = ["PoolControl"]

log = logging.getLogger("slime.engines.pool")  # the pool's logger
OnUnreachable = Literal["skip", "take_out", "take_out_and_raise", "raise"]
R = TypeVar("R")


class PoolControl:
    """Control calls on ``workers`` and the weight state of the pool (module docstring).

    Args:
        workers: the pool's workers (the calls address those in rotation; failures go on their breakers).
        abort: the pool's abort signal (``abort_all`` also ends the pool's own waiting generates).
        check_open: raises when the pool is closed.
        weights: ``(model_path, weight_version)`` the workers hold at start.
    """

    def __init__(
        self, workers: Workers, *, abort: AbortSignal, check_open: Callable[[], None], weights: tuple[str, str] | None
    ):
        self._workers = workers
        self._abort = abort
        self._check_open = check_open
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
        self.paused_mode: PauseMode | None = None
        self.memory_released = False
        """Between ``release_memory_occupation`` and ``resume_memory_occupation`` (no health probes then)."""

    async def fan_out(
        self,
        what: str,
        call: Callable[[EngineClient], Awaitable[R]],
        *,
        on_unreachable: OnUnreachable = "raise",
        clients: Sequence[EngineClient] | None = None,
    ) -> dict[str, R]:
        """Run ``call`` on every worker in rotation (or ``clients``) concurrently; all are tried.

        Returns ``{url: result}`` of the workers that answered. Raises the failures' common
        ``EngineError`` class (else ``EngineError``) naming every failed engine; a non-engine
        exception (a bug) propagates as is.
        """
        self._check_open()
        clients = list(self._workers.clients if clients is None else clients)
        outcomes = await asyncio.gather(*(call(c) for c in clients), return_exceptions=True)
        failed: list[tuple[EngineClient, EngineError]] = []
        for c, o in zip(clients, outcomes):
            if isinstance(o, BaseException) and (error := self._failure_kept(what, c, o, on_unreachable)) is not None:
                failed.append((c, error))
        if failed:
            raise await _failure(what, failed, len(clients), name_dead=on_unreachable != "raise")
        return {c.url: o for c, o in zip(clients, outcomes) if not isinstance(o, BaseException)}

    def _failure_kept(
        self, what: str, client: EngineClient, exc: BaseException, on_unreachable: OnUnreachable
    ) -> EngineError | None:
        """``exc`` if ``client``'s failure is raised, None if it is skipped (after its breaker or rotation hears of it).

        Raises:
            ``exc`` itself when it is no ``EngineError`` (a bug).
        """
        if not isinstance(exc, EngineError):
            raise exc
        if not isinstance(exc, (EngineUnavailable, EngineTimeout)) or on_unreachable == "raise":
            return exc
        if on_unreachable == "skip":
            log.warning("%s: engine %s unreachable, skipped: %s", what, client.url, exc)
            self._workers.record_failure(client.url, f"{what}: {exc}")
            return None
        self._workers.take_out(client.url, f"{what} failed: {exc}")
        return None if on_unreachable == "take_out" else exc

    async def abort_all(self) -> dict[str, None]:
        """``POST /abort_request {"abort_all": true}`` on every worker (docs/sglang.md#abort); also ends the pool's own
        generate calls that are between retries or waiting for a worker (they return an abort)."""
        self._abort.fire()
        return await self.fan_out("abort_all", lambda c: c.abort(abort_all=True), on_unreachable="skip")

    async def pause_generation(self, mode: PauseMode = "abort") -> dict[str, None]:
        """Every worker pauses (docs/sglang.md#pause); a worker that rejoins before ``continue_generation`` is paused too."""
        self.paused_mode = mode
        return await self.fan_out(
            f"pause_generation({mode})", lambda c: c.pause_generation(mode), on_unreachable="skip"
        )

    async def continue_generation(self) -> dict[str, None]:
        self.paused_mode = None
        return await self.fan_out("continue_generation", lambda c: c.continue_generation(), on_unreachable="skip")

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str, *, abort_all_requests: bool = False, flush_cache: bool = True
    ) -> dict[str, JsonObject]:
        """Every worker loads ``model_path`` (docs/sglang.md#update-weights-from-disk); it becomes ``weights`` for later rejoins.
        Returns ``{url: {"success", "message", ...}}`` of the workers that loaded it.

        Raises:
            EngineRequestError (or another EngineError): naming each engine that reported failure.
        """
        async with self.weights_lock:
            self.weights, self.latest_version = (model_path, weight_version), weight_version
            out = await self.fan_out(
                f"update_weights_from_disk({model_path!r}, weight_version={weight_version!r})",
                lambda c: c.update_weights_from_disk(
                    model_path,
                    weight_version=weight_version,
                    abort_all_requests=abort_all_requests,
                    flush_cache=flush_cache,
                ),
                on_unreachable="take_out",
            )
            self._note_flush(flush_cache, weight_version)
            return out

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
        """Every worker receives one bucket over the weights-update group (docs/sglang.md#update-weights-from-distributed);
        arguments as ``EngineClient.update_weights_from_distributed``. The caller broadcasts concurrently."""
        async with self.weights_lock:
            self._note_version(weight_version)
            out = await self.fan_out(
                f"update_weights_from_distributed({len(names)} tensors)",
                lambda c: c.update_weights_from_distributed(
                    names,
                    dtypes,
                    shapes,
                    group_name=group_name,
                    weight_version=weight_version,
                    abort_all_requests=abort_all_requests,
                    flush_cache=flush_cache,
                    load_format=load_format,
                    timeout_s=timeout_s,
                ),
                on_unreachable="take_out_and_raise",
            )
            self._note_flush(flush_cache, weight_version)
            return out

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
        """Every worker loads the same payload (docs/sglang.md#update-weights-from-tensor); arguments as
        ``EngineClient.update_weights_from_tensor``."""
        async with self.weights_lock:
            self._note_version(weight_version)
            out = await self.fan_out(
                "update_weights_from_tensor",
                lambda c: c.update_weights_from_tensor(
                    serialized_named_tensors,
                    weight_version=weight_version,
                    load_format=load_format,
                    abort_all_requests=abort_all_requests,
                    flush_cache=flush_cache,
                    timeout_s=timeout_s,
                ),
                on_unreachable="take_out_and_raise",
            )
            self._note_flush(flush_cache, weight_version)
            return out

    @contextlib.asynccontextmanager
    async def weight_update(self, weight_version: str, *, flush_cache: bool) -> AsyncIterator[None]:
        """For a sync that sends to each worker itself (``DeltaWeightSync``): inside, ``weights_lock`` is held
        (no rejoin between two workers' loads) and ``latest_version`` is ``weight_version``; after the block,
        ``kv_cache_version`` too when the caches were flushed. Without this a rejoining engine compared itself
        with a stale ``latest_version`` and came back with its start weights, and cache-hit tokens kept
        being stamped with the version of the last flush the pool had heard of."""
        async with self.weights_lock:
            self._note_version(weight_version)
            yield
            self._note_flush(flush_cache, weight_version)

    def note_cache_hit(self) -> None:
        """A result reused cached KV (``cached_tokens > 0``): count it in ``num_prefix_cache_hits``."""
        self.num_prefix_cache_hits += 1

    def _note_version(self, weight_version: object) -> None:
        if weight_version is not None:
            self.latest_version = str(weight_version)

    def _note_flush(self, flushed: bool, weight_version: object) -> None:
        """After an update: with ``flush_cache`` the prefix caches hold only KV of ``weight_version``."""
        if flushed and weight_version is not None:
            self.kv_cache_version, self.num_prefix_cache_hits = str(weight_version), 0

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]:
        """Every worker frees ``tags`` (None = all) for a colocated trainer (docs/sglang.md#memory); workers must be idle."""
        self.memory_released = True
        return await self.fan_out(
            "release_memory_occupation", lambda c: c.release_memory_occupation(tags), on_unreachable="skip"
        )

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]:
        """Every worker re-maps ``tags`` (docs/sglang.md#memory); released weights must be synced again afterwards."""
        self.memory_released = False
        return await self.fan_out(
            "resume_memory_occupation", lambda c: c.resume_memory_occupation(tags), on_unreachable="skip"
        )

    async def flush_cache(self) -> dict[str, bool]:
        """``{url: flushed}``; False where the worker was busy (docs/sglang.md#flush-cache). When every worker flushed, their
        caches hold nothing older than ``latest_version`` (``kv_cache_version``)."""
        async with self.weights_lock:
            out = await self.fan_out("flush_cache", lambda c: c.flush_cache(), on_unreachable="skip")
            if out and all(out.values()) and len(out) == len(self._workers.clients):
                self.kv_cache_version, self.num_prefix_cache_hits = self.latest_version, 0
            return out

    async def rejoin(self, url: str) -> None:
        """Sync ``url`` to the current weights if its ``weight_version`` differs, pause it if the pool is
        paused, close its breaker and put it back in rotation.

        The current version is what a worker in rotation reports (so a sync that bypassed the pool
        counts), else ``latest_version``; it is replayed from ``weights`` (disk) when that holds it.

        Raises:
            EngineRequestError: the current version is not on disk (a tensor/NCCL/delta update).
            EngineError: from the engine calls.
        """
        client = self._workers.get(url).client
        async with self.weights_lock:
            target = await self._current_version(client)
            if target is not None:
                await self._sync_to(client, target)
            if self.paused_mode is not None:
                await client.pause_generation(self.paused_mode)
            self._workers.put_back(client.url)
        log.info("engine %s back in rotation at weight_version %s", client.url, self.latest_version)
        self._workers.wake_waiters()

    async def _current_version(self, rejoiner: EngineClient) -> str | None:
        """The version a peer in rotation reports (a sync that bypassed the pool counts), else ``latest_version``."""
        target = self.latest_version
        for peer in [c for c in self._workers.clients if c.url != rejoiner.url][:1]:
            with contextlib.suppress(EngineError):
                if (version := (await peer.model_info()).get("weight_version")) is not None:
                    target = str(version)
        return target

    async def _sync_to(self, client: EngineClient, target: str) -> None:
        """Replay the disk weights on ``client`` unless it holds ``target`` already (raises if not on disk)."""
        held = str((await client.model_info()).get("weight_version"))
        if held == target:
            return
        if self.weights is None or self.weights[1] != target:
            raise EngineRequestError(
                f"holds weight_version {held!r}; the current one, {target!r}, was not written to disk, "
                "so it cannot be re-synced (only update_weights_from_disk is replayed on rejoin)",
                url=client.url,
                endpoint="(rejoin)",
            )
        path, version = self.weights
        await client.update_weights_from_disk(path, weight_version=version, abort_all_requests=True)

    async def wait_ready(
        self, timeout_s: float, *, refused_grace_s: float | None = None, refused_hint: str = ""
    ) -> None:
        """Wait until every worker (in rotation or not) answers ``/health_generate`` 200 and close their breakers.

        ``refused_grace_s``: for workers nobody here launched (external addresses): when every one of
        them refuses TCP connections (ECONNREFUSED: nothing listens there) at every probe for this
        long, stop waiting and raise then, not at ``timeout_s``; ``refused_hint`` ends that error's
        message. A worker that accepts a connection, or fails otherwise (a connect timeout: a host
        that is down or filtered), is waited for the whole ``timeout_s``.

        Raises:
            EngineUnavailable: every worker refused connections for ``refused_grace_s``; and as
                ``EngineClient.wait_ready``.
        """
        clients = [self._workers.get(u).client for u in self._workers.urls]
        ready = self.fan_out("wait_ready", lambda c: c.wait_ready(timeout_s), clients=clients)
        if refused_grace_s is None or refused_grace_s >= timeout_s:
            await ready
        else:
            await wait_unless_refused(
                ready, [c.url for c in clients], refused_grace_s, endpoint="/health_generate", hint=refused_hint
            )
        for c in clients:
            self._workers.record_success(c.url)


async def _failure(
    what: str, failed: list[tuple[EngineClient, EngineError]], num_clients: int, *, name_dead: bool
) -> EngineError:
    """One error naming every failed engine, of the failures' common class (else ``EngineError``).
    ``name_dead``: during the run (not at start) a killed engine is named dead, not by whatever call noticed it first."""
    first = failed[0][1]
    classes = {type(exc) for _, exc in failed}
    cls = classes.pop() if len(classes) == 1 else EngineError
    named = [failure_line(c.url, exc) if name_dead else as_is(c.url, exc) for c, exc in failed]
    lines = "; ".join(await asyncio.gather(*named))
    error = cls(
        f"{what} failed on {len(failed)} of {num_clients} engines: {lines}",
        url=first.url,
        endpoint=first.endpoint,
        status=first.status,
        engine_message=first.engine_message,
    )
    error.__cause__ = first
    return error
