"""``EngineSupervisor``: finds engines that died or stopped answering, and restarts or sidelines them.

::

    every health_check_interval_s ──► process exited? ──yes──► trip breaker ─┐
      (or woken by the pool)          │ no                                   │
                                      ▼                                      ▼
                   GET /health_generate (health_check_timeout_s)     breaker OPEN (K failures of
                   ok: record_success / fail: record_failure ──────► probes or requests, or trip)
                                                                             │ pool.on_engine_down
                                                                             ▼
          launch mode: take out of rotation -> router: remove worker -> restart the process (same
          command, port and GPUs) -> wait ready -> pool.rejoin (update_weights_from_disk to the latest
          weights and version, pause if the pool is paused) -> router: add worker. At most
          ``max_engine_restarts`` per engine; past that it stays out for the rest of the run.
          external mode: take out of rotation -> probe /health_generate after the breaker's cooldown,
          doubling (half-open) -> on success pool.rejoin.

Requests that were in flight on the engine fail with ``EngineUnavailable`` and the pool retries them
on another engine with the same ``input_ids`` (prompt + partial tokens); the supervisor never
touches samples. What it consumes: pool failure signals and a clock. What it produces: engines
back in rotation, and ``events`` (``(kind, url, detail)``, kinds ``down``, ``restarted``,
``rejoined``, ``gave_up``). It waits on the interval or on a down signal.

Not covered: restarting a router (a dead launched router fails the run's requests after their
retries), multi-node placement, re-syncing weights that were never written to disk (see ``rejoin``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from slime.config import EngineConfig
from slime.engines.pool import HttpEnginePool
from slime.engines.router import RouterClient, WorkerRegistration
from slime.errors import EngineError, EngineRequestError

__all__ = ["EngineSupervisor", "EngineProcess"]

log = logging.getLogger(__name__)


class EngineProcess(Protocol):
    """A worker process the supervisor can restart (``CommandProcess``, ``EmbeddedEngineProcess``)."""

    name: str

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None:
        """None while it runs."""
        ...

    async def restart(self, startup_timeout_s: float) -> str:
        """Stop it, start it again and wait until ready; returns its url."""
        ...


class EngineSupervisor:
    """Watches ``pool``'s workers; restarts those in ``processes`` (launch mode), sidelines the rest.

    Args:
        pool: the ``HttpEnginePool``; its ``on_engine_down`` is set to this supervisor.
        config: health-check interval and timeout, breaker cooldown, restart bound, startup timeout.
        processes: ``{url: process}`` of the workers we launched (``restart(timeout)``, ``returncode``).
        router: a router whose registration follows the workers we launched (remove on down, add on rejoin).
        registration: ``{url: {"worker_type", "bootstrap_port"}}`` for ``router.add_worker`` (PD workers).
    """

    def __init__(
        self,
        pool: HttpEnginePool,
        *,
        config: EngineConfig,
        processes: Mapping[str, EngineProcess] | None = None,
        router: RouterClient | None = None,
        registration: Mapping[str, WorkerRegistration] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.pool, self.config = pool, config
        self.processes = dict(processes or {})
        self.router = router
        self.registration = dict(registration or {})
        self.clock = clock
        self.events: list[tuple[str, str, str]] = []
        self.num_restarts: dict[str, int] = {}
        self.given_up: set[str] = set()
        self._recovering: dict[str, asyncio.Task] = {}
        self._last_check: dict[str, float] = {}
        self._down_reason: dict[str, str] = {}
        self._probing: dict[str, asyncio.Task] = {}
        self._wake = asyncio.Event()
        self._closed = False
        self._changed = asyncio.Condition()
        pool.on_engine_down = self._on_down

    def _on_down(self, url: str, reason: str) -> None:
        """Called by the pool (synchronously) when a breaker opens or a worker is taken out."""
        if url not in self._recovering and url not in self.given_up:
            self.events.append(("down", url, reason))
            self._down_reason[url] = reason
        self._wake.set()

    async def run(self) -> None:
        """Check and recover until ``close()``; recovery tasks run in this call's TaskGroup."""
        async with asyncio.TaskGroup() as tg:
            while not self._closed:
                await self.check_once(tg)
                interval = self.config.health_check_interval_s or 3600.0
                try:
                    async with asyncio.timeout(interval):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                self._wake.clear()
            for task in [*self._recovering.values(), *self._probing.values()]:
                task.cancel()  # our own restarts and probes: a process half-started is stopped by the launcher's exit

    def close(self) -> None:
        """Stop ``run`` (idempotent)."""
        self._closed = True
        self._wake.set()

    async def check_once(self, tg: asyncio.TaskGroup) -> None:
        """One round: exited processes, due health checks, and recoveries for every down worker."""
        now = self.clock()
        # A paused engine answers /health_generate 503 (and SGLang's probe gives up after 20 s, docs/sglang.md#health); one
        # whose memory is released must not run the probe's forward pass (docs/sglang.md#memory): no probes then.
        quiet = self.pool.paused_mode is not None or self.pool.memory_released
        for url in self.pool.urls:
            if url in self._recovering or url in self.given_up or url in self._probing:
                continue
            proc = self.processes.get(url)
            if proc is not None and proc.returncode is not None:
                self.pool.trip(url, f"process {proc.name} (pid {proc.pid}) exited with code {proc.returncode}")
            elif (
                not quiet
                and self.config.health_check_interval_s
                and now - self._last_check.get(url, -1e18) >= self.config.health_check_interval_s
            ):
                # a probe may take health_check_timeout_s: it must not hold up this loop
                self._probing[url] = tg.create_task(self._probe(url), name=f"probe-{url}")
        for row in self.pool.engine_states():
            url = row["url"]
            if url in self._recovering or url in self.given_up or (row["in_rotation"] and row["breaker"] == "closed"):
                continue
            reason = row["out_reason"] or self._down_reason.pop(url, f"circuit breaker {row['breaker']}")
            recover = self._restart if url in self.processes else self._watch
            self._recovering[url] = tg.create_task(self._recover(url, recover), name=f"recover-{url}")
            self.pool.take_out(url, reason)

    async def _probe(self, url: str) -> None:
        self._last_check[url] = self.clock()
        try:
            problem = await self.pool.client(url).health_problem(timeout_s=self.config.health_check_timeout_s)
        except EngineRequestError as exc:  # a 4xx: misconfigured, not going to heal by itself
            problem = f"/health_generate refused: {exc}"
            log.warning("health check of %s: %s", url, exc)
        finally:
            self._probing.pop(url, None)
        if url not in self.pool.urls:
            return
        if problem is None:
            self.pool.record_success(url)
        elif url in self._recovering:  # it left rotation while this probe ran: the recovery owns its breaker now
            self.pool.note_failure(url, problem)
        else:
            self.pool.record_failure(url, problem)

    async def _recover(self, url: str, how: Callable[[str], Awaitable[None]]) -> None:
        try:
            await self._deregister(url)
            await how(url)
        finally:
            del self._recovering[url]
            async with self._changed:
                self._changed.notify_all()

    async def _restart(self, url: str) -> None:
        proc = self.processes[url]
        delay_s = self.config.circuit_breaker_cooldown_s
        while not self._closed:
            if self.num_restarts.get(url, 0) >= self.config.max_engine_restarts:
                self.given_up.add(url)
                self.events.append(("gave_up", url, f"{self.config.max_engine_restarts} restarts"))
                log.error(
                    "engine %s stays out of rotation: %d restarts did not keep it up",
                    url,
                    self.config.max_engine_restarts,
                )
                down = next(
                    (r["out_reason"] or r["last_failure"] for r in self.pool.engine_states() if r["url"] == url), ""
                )
                self.pool.retire(
                    url,
                    f"{down}; not restarted again after {self.config.max_engine_restarts} restarts (--max-engine-restarts)",
                )
                return
            while self.pool.memory_released and not self._closed:
                await asyncio.sleep(self.config.circuit_breaker_cooldown_s)  # colocated: the trainer holds the GPUs
            self.num_restarts[url] = self.num_restarts.get(url, 0) + 1
            old_pid = proc.pid
            try:
                await proc.restart(self.config.startup_timeout_s)
                await self.pool.rejoin(url)
            except EngineError as exc:
                log.warning(
                    "restart %d of engine %s failed: %s; next try in %.0fs", self.num_restarts[url], url, exc, delay_s
                )
                await asyncio.sleep(delay_s)
                delay_s = min(2 * delay_s, 8 * self.config.circuit_breaker_cooldown_s)
                continue
            await self._register(url)
            self.events.append(("restarted", url, f"pid {old_pid} -> {proc.pid}"))
            log.warning("engine %s restarted (pid %s -> %s) and back in rotation", url, old_pid, proc.pid)
            return

    async def _watch(self, url: str) -> None:
        delay_s = self.config.circuit_breaker_cooldown_s
        client = self.pool.client(url)
        while not self._closed:
            await asyncio.sleep(delay_s)
            try:
                problem = await client.health_problem(timeout_s=self.config.health_check_timeout_s)
                if problem is None:
                    await self.pool.rejoin(url)
                    self.events.append(("rejoined", url, ""))
                    return
            except EngineError as exc:
                problem = f"answers but cannot rejoin: {exc}"
                log.warning("engine %s answers but cannot rejoin yet: %s", url, exc)
            self.pool.note_failure(url, problem)
            delay_s = min(2 * delay_s, 8 * self.config.circuit_breaker_cooldown_s)
            log.info("engine %s is still out of rotation (%s); next probe in %.0fs", url, problem, delay_s)

    async def _deregister(self, url: str) -> None:
        if self.router is not None and url in self.processes:
            try:
                await self.router.remove_worker(url)
            except EngineError as exc:  # the router's own health checks will sideline it
                log.warning("could not remove %s from router %s: %s", url, self.router.url, exc)

    async def _register(self, url: str) -> None:
        if self.router is not None and url in self.processes:
            try:
                await self.router.add_worker(url, **self.registration.get(url, {}))
            except EngineError as exc:  # control calls still reach it; the router does not route to it
                log.error("engine %s is back but router %s refused it: %s", url, self.router.url, exc)

    async def wait_idle(self) -> None:
        """Until no recovery is running (for tests and shutdown)."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._recovering)
