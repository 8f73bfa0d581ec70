"""The control calls of ``HttpEnginePool``, and taking workers out of rotation and back.

Each control call goes to every worker in rotation, concurrently.

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
import socket
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Literal

from slime.engines.client import EngineClient
from slime.errors import EngineError, EngineRequestError, EngineTimeout, EngineUnavailable

__all__ = ["PoolControl", "refuses_connections", "wait_unless_refused"]

log = logging.getLogger(__name__)
OnUnreachable = Literal["skip", "take_out", "take_out_and_raise", "raise"]
REFUSED_PROBE_INTERVAL_S = 0.5
"""Seconds between the TCP probes of ``refused_throughout``."""
_PROBE_TIMEOUT_S = 2.0


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
    ready: Coroutine[Any, Any, Any], urls: Sequence[str], grace_s: float, *, endpoint: str, hint: str = ""
) -> Any:
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


async def _failure_line(url: str, exc: EngineError) -> str:
    """``url: <error>`` for a failed control call; ``url: dead (...)`` when it could not connect and nothing
    listens at ``url`` now."""
    if isinstance(exc, EngineUnavailable) and await refuses_connections(url):
        return f"{url}: dead (connection refused: nothing listens there)"
    return await _as_is(url, exc)


async def _as_is(url: str, exc: EngineError) -> str:
    return f"{url}: {exc}"


class PoolControl:
    """Mixin of ``HttpEnginePool`` (which provides ``clients``, ``record_failure``, ``take_out``, ...)."""

    if TYPE_CHECKING:  # provided by HttpEnginePool

        @property
        def clients(self) -> list[EngineClient]: ...

        def record_failure(self, url: str, reason: str) -> None: ...

        def client(self, url: str) -> EngineClient: ...

        def record_success(self, url: str) -> None: ...

        @property
        def urls(self) -> list[str]: ...

        def _engine(self, url: str, *, pop: bool = False) -> Any: ...

        def _check_open(self) -> None: ...

        def _notify_down(self, url: str, reason: str) -> None: ...

        def end_attempts(self, url: str, reason: str) -> None: ...

        def _wake_waiters(self) -> None: ...

    paused_mode: str | None
    memory_released: bool = False
    """Between ``release_memory_occupation`` and ``resume_memory_occupation`` (no health probes then)."""
    weights: tuple[str, str] | None
    weights_lock: asyncio.Lock
    latest_version: str | None
    kv_cache_version: str | None
    num_prefix_cache_hits: int
    _abort_epoch: int
    _abort_event: asyncio.Event
    _rotation_event: asyncio.Event

    async def _fan_out(
        self,
        what: str,
        call: Callable[[EngineClient], Awaitable[Any]],
        *,
        on_unreachable: OnUnreachable = "raise",
        clients: Sequence[EngineClient] | None = None,
    ) -> dict[str, Any]:
        """Run ``call`` on every worker in rotation (or ``clients``) concurrently; all are tried.

        Returns ``{url: result}`` of the workers that answered. Raises the failures' common
        ``EngineError`` class (else ``EngineError``) naming every failed engine; a non-engine
        exception (a bug) propagates as is.
        """
        self._check_open()
        clients = list(self.clients if clients is None else clients)
        outcomes = await asyncio.gather(*(call(c) for c in clients), return_exceptions=True)
        failed: list[tuple[EngineClient, EngineError]] = []
        for c, o in zip(clients, outcomes):
            if not isinstance(o, BaseException):
                continue
            if not isinstance(o, EngineError):
                raise o
            if isinstance(o, (EngineUnavailable, EngineTimeout)) and on_unreachable != "raise":
                if on_unreachable == "skip":
                    log.warning("%s: engine %s unreachable, skipped: %s", what, c.url, o)
                    self.record_failure(c.url, f"{what}: {o}")
                    continue
                self.take_out(c.url, f"{what} failed: {o}")
                if on_unreachable == "take_out":
                    continue
            failed.append((c, o))
        if failed:
            first = failed[0][1]
            classes = {type(exc) for _, exc in failed}
            cls = classes.pop() if len(classes) == 1 else EngineError
            # during the run (not at start) a killed engine is named dead, not by whatever call noticed it first
            named = [_failure_line(c.url, exc) if on_unreachable != "raise" else _as_is(c.url, exc) for c, exc in failed]
            lines = "; ".join(await asyncio.gather(*named))
            raise cls(
                f"{what} failed on {len(failed)} of {len(clients)} engines: {lines}",
                url=first.url,
                endpoint=first.endpoint,
                status=first.status,
                engine_message=first.engine_message,
            ) from first
        return {c.url: o for c, o in zip(clients, outcomes) if not isinstance(o, BaseException)}

    async def abort_all(self) -> dict[str, None]:
        """``POST /abort_request {"abort_all": true}`` on every worker (docs/sglang.md#abort); also ends the pool's own
        generate calls that are between retries or waiting for a worker (they return an abort)."""
        self._abort_epoch += 1
        event, self._abort_event = self._abort_event, asyncio.Event()
        event.set()
        return await self._fan_out("abort_all", lambda c: c.abort(abort_all=True), on_unreachable="skip")

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> dict[str, None]:
        """Every worker pauses (docs/sglang.md#pause); a worker that rejoins before ``continue_generation`` is paused too."""
        self.paused_mode = mode
        return await self._fan_out(f"pause_generation({mode})", lambda c: c.pause_generation(mode), on_unreachable="skip")

    async def continue_generation(self) -> dict[str, None]:
        self.paused_mode = None
        return await self._fan_out("continue_generation", lambda c: c.continue_generation(), on_unreachable="skip")

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str, *, abort_all_requests: bool = False, flush_cache: bool = True
    ) -> dict[str, dict[str, Any]]:
        """Every worker loads ``model_path`` (docs/sglang.md#update-weights-from-disk); it becomes ``weights`` for later rejoins.
        Returns ``{url: {"success", "message", ...}}`` of the workers that loaded it.

        Raises:
            EngineRequestError (or another EngineError): naming each engine that reported failure.
        """
        async with self.weights_lock:
            self.weights, self.latest_version = (model_path, weight_version), weight_version
            out = await self._fan_out(
                f"update_weights_from_disk({model_path!r}, weight_version={weight_version!r})",
                lambda c: c.update_weights_from_disk(
                    model_path, weight_version=weight_version, abort_all_requests=abort_all_requests, flush_cache=flush_cache
                ),
                on_unreachable="take_out",
            )
            self._note_flush(flush_cache, weight_version)
            return out

    async def update_weights_from_distributed(
        self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], **kwargs: Any
    ) -> dict[str, dict[str, Any]]:
        """Every worker receives one bucket over the weights-update group (docs/sglang.md#update-weights-from-distributed); ``kwargs`` as
        ``EngineClient.update_weights_from_distributed``. The caller broadcasts concurrently."""
        async with self.weights_lock:
            self._note_version(kwargs)
            out = await self._fan_out(
                f"update_weights_from_distributed({len(names)} tensors)",
                lambda c: c.update_weights_from_distributed(names, dtypes, shapes, **kwargs),
                on_unreachable="take_out_and_raise",
            )
            self._note_flush(kwargs.get("flush_cache", True), kwargs.get("weight_version"))
            return out

    async def update_weights_from_tensor(self, serialized_named_tensors: Sequence[str], **kwargs: Any) -> dict[str, dict[str, Any]]:
        """Every worker loads the same payload (docs/sglang.md#update-weights-from-tensor); ``kwargs`` as ``EngineClient.update_weights_from_tensor``."""
        async with self.weights_lock:
            self._note_version(kwargs)
            out = await self._fan_out(
                "update_weights_from_tensor",
                lambda c: c.update_weights_from_tensor(serialized_named_tensors, **kwargs),
                on_unreachable="take_out_and_raise",
            )
            self._note_flush(kwargs.get("flush_cache", True), kwargs.get("weight_version"))
            return out

    def _note_version(self, kwargs: dict[str, Any]) -> None:
        if kwargs.get("weight_version") is not None:
            self.latest_version = str(kwargs["weight_version"])

    def _note_flush(self, flushed: bool, weight_version: Any) -> None:
        """After an update: with ``flush_cache`` the prefix caches hold only KV of ``weight_version``."""
        if flushed and weight_version is not None:
            self.kv_cache_version, self.num_prefix_cache_hits = str(weight_version), 0

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]:
        """Every worker frees ``tags`` (None = all) for a colocated trainer (docs/sglang.md#memory); workers must be idle."""
        self.memory_released = True
        return await self._fan_out("release_memory_occupation", lambda c: c.release_memory_occupation(tags), on_unreachable="skip")

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> dict[str, None]:
        """Every worker re-maps ``tags`` (docs/sglang.md#memory); released weights must be synced again afterwards."""
        self.memory_released = False
        return await self._fan_out("resume_memory_occupation", lambda c: c.resume_memory_occupation(tags), on_unreachable="skip")

    async def flush_cache(self) -> dict[str, bool]:
        """``{url: flushed}``; False where the worker was busy (docs/sglang.md#flush-cache). When every worker flushed, their
        caches hold nothing older than ``latest_version`` (``kv_cache_version``)."""
        async with self.weights_lock:
            out = await self._fan_out("flush_cache", lambda c: c.flush_cache(), on_unreachable="skip")
            if out and all(out.values()) and len(out) == len(self.clients):
                self.kv_cache_version, self.num_prefix_cache_hits = self.latest_version, 0
            return out

    def take_out(self, url: str, reason: str) -> bool:
        """Stop routing to and controlling ``url`` until ``rejoin``; its generate attempts end now and are
        retried elsewhere (``end_attempts``). Returns False if it was already out."""
        engine = self._engine(url)
        if not engine.in_rotation:
            return False
        engine.in_rotation, engine.out_reason = False, reason
        log.warning("engine %s taken out of rotation: %s", engine.client.url, reason)
        self.end_attempts(engine.client.url, f"taken out of rotation: {reason}")  # not waited for until their timeout
        self._notify_down(engine.client.url, reason)
        return True

    async def rejoin(self, url: str) -> None:
        """Sync ``url`` to the current weights if its ``weight_version`` differs, pause it if the pool is
        paused, close its breaker and put it back in rotation.

        The current version is what a worker in rotation reports (so a sync that bypassed the pool
        counts), else ``latest_version``; it is replayed from ``weights`` (disk) when that holds it.

        Raises:
            EngineRequestError: the current version is not on disk (a tensor/NCCL/delta update).
            EngineError: from the engine calls.
        """
        engine = self._engine(url)
        async with self.weights_lock:
            target = self.latest_version
            for peer in [c for c in self.clients if c.url != engine.client.url][:1]:
                with contextlib.suppress(EngineError):
                    if (version := (await peer.model_info()).get("weight_version")) is not None:
                        target = str(version)
            if target is not None:
                held = str((await engine.client.model_info()).get("weight_version"))
                if held != target:
                    if self.weights is None or self.weights[1] != target:
                        raise EngineRequestError(
                            f"holds weight_version {held!r}; the current one, {target!r}, was not written to disk, "
                            "so it cannot be re-synced (only update_weights_from_disk is replayed on rejoin)",
                            url=engine.client.url,
                            endpoint="(rejoin)",
                        )
                    path, version = self.weights
                    await engine.client.update_weights_from_disk(path, weight_version=version, abort_all_requests=True)
            if self.paused_mode is not None:
                await engine.client.pause_generation(self.paused_mode)
            self.record_success(engine.client.url)
            engine.in_rotation, engine.out_reason, engine.retired, engine.cause = True, "", False, ""
        log.info("engine %s back in rotation at weight_version %s", engine.client.url, self.latest_version)
        self._wake_waiters()

    async def wait_ready(self, timeout_s: float, *, refused_grace_s: float | None = None, refused_hint: str = "") -> None:
        """Wait until every worker answers ``/health_generate`` 200 and close their breakers.

        ``refused_grace_s``: for workers nobody here launched (external addresses): when every one of
        them refuses TCP connections (ECONNREFUSED: nothing listens there) at every probe for this
        long, stop waiting and raise then, not at ``timeout_s``; ``refused_hint`` ends that error's
        message. A worker that accepts a connection, or fails otherwise (a connect timeout: a host
        that is down or filtered), is waited for the whole ``timeout_s``.

        Raises:
            EngineUnavailable: every worker refused connections for ``refused_grace_s``; and as
                ``EngineClient.wait_ready``.
        """
        clients = [self.client(u) for u in self.urls]
        ready = self._fan_out("wait_ready", lambda c: c.wait_ready(timeout_s), clients=clients)
        if refused_grace_s is None or refused_grace_s >= timeout_s:
            await ready
        else:
            await wait_unless_refused(ready, [c.url for c in clients], refused_grace_s, endpoint="/health_generate", hint=refused_hint)
        for c in clients:
            self.record_success(c.url)
