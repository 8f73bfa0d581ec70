"""The health bookkeeping of ``HttpEnginePool``: each worker's breaker, its last failure, and why it is out.

Every failure of a worker (a ``/generate`` or control call that got no answer, a failed health
check) is recorded with its reason; every answer resets it. When a worker's breaker opens, its
process exits (``trip``), it is taken out of rotation or given up on for good (``retire``), the
generate attempts still on it end at once and are retried elsewhere (``PoolTimeouts.end_attempts``):
a request on an engine that left rotation is not waited for until its own timeout.

With no worker in rotation, a generate waits ``rejoin_timeout_s`` for one to come back (a restart, an
external engine that answers again) and then raises ``EnginesGone`` (``engines_gone``): one line
naming each worker and why, e.g.::

    no engine left to serve /generate (none came back within 1.5s): engine http://127.0.0.1:41011:
    no answer to /health_generate within 0.5s (no successful answer for 4s); engine http://127.0.0.1:41013:
    dead (connection refused: nothing listens there)

(one line; broken here). "Dead" is what a TCP connect to the worker's address says at that moment,
whatever call noticed first (a weight update, a generate); ``retire`` (the supervisor gave up
restarting it) at once, without waiting.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from slime.engines.breaker import CircuitBreaker
from slime.engines.client import EngineClient
from slime.engines.pool_control import refuses_connections
from slime.errors import EngineError, EnginesGone

__all__ = ["PoolEngine", "PoolHealth", "failure_text"]

log = logging.getLogger("slime.engines.pool")  # the pool's logger
_MAX_REASON_CHARS = 240  # one engine's part of the EnginesGone line


@dataclasses.dataclass(eq=False)
class PoolEngine:
    """One worker of the pool and its health."""

    client: EngineClient
    breaker: CircuitBreaker
    in_rotation: bool = True
    out_reason: str = ""
    """Why it left rotation (empty while in rotation)."""
    num_picks: int = 0
    last_failure: str = ""
    """The reason of its latest failure since it last answered (empty after an answer)."""
    cause: str = ""
    """What happened to its process (``trip``, ``retire``): named in ``EnginesGone`` even when it is dead."""
    answered_at: float = dataclasses.field(default_factory=time.monotonic)
    """``time.monotonic()`` of its latest successful answer (its creation before any)."""
    retired: bool = False
    """Given up on for the rest of the run (``retire``): never waited for."""


def failure_text(exc: BaseException) -> str:
    """``exc`` as a reason, one line, without the engine's url in front (the line names the engine)."""
    text = str(exc)
    if isinstance(exc, EngineError) and exc.url:
        text = text.removeprefix(exc.url)
    return " ".join(text.split())


class PoolHealth:
    """Mixin of ``HttpEnginePool`` (which provides ``_engines``, ``_rotation_event`` and ``end_attempts``)."""

    if TYPE_CHECKING:  # provided by HttpEnginePool

        def end_attempts(self, url: str, reason: str) -> None: ...

        def _engine(self, url: str, *, pop: bool = False) -> PoolEngine: ...

    _engines: dict[str, PoolEngine]
    _rotation_event: asyncio.Event
    on_engine_down: Any
    rejoin_timeout_s: float
    _outage_logged: bool
    _diagnosis: asyncio.Future[tuple[str, dict[str, str]]] | None

    def engine_states(self) -> list[dict[str, Any]]:
        """One row per worker: url, in_rotation, out_reason, breaker state, consecutive failures, in flight,
        picks, last_failure, retired."""
        return [
            {
                "url": u,
                "in_rotation": e.in_rotation,
                "out_reason": e.out_reason,
                "breaker": e.breaker.state.value,
                "consecutive_failures": e.breaker.num_consecutive_failures,
                "num_inflight": e.client.num_inflight,
                "num_picks": e.num_picks,
                "last_failure": e.last_failure,
                "retired": e.retired,
            }
            for u, e in self._engines.items()
        ]

    def record_success(self, url: str) -> None:
        """``url`` answered: close its breaker, forget its last failure."""
        engine = self._engine(url)
        engine.breaker.record_success()
        engine.answered_at, engine.last_failure = time.monotonic(), ""

    def record_failure(self, url: str, reason: str) -> None:
        """Count a failure of ``url``; if its breaker opens, end its generate attempts and tell ``on_engine_down``."""
        if url.rstrip("/") not in self._engines:
            return
        engine = self._engine(url)
        engine.last_failure = reason
        if engine.breaker.record_failure():
            log.warning("engine %s: circuit breaker open after %s", engine.client.url, reason)
            self.end_attempts(engine.client.url, f"its circuit breaker opened after {reason}")
            self._notify_down(url, reason)

    def note_failure(self, url: str, reason: str) -> None:
        """Remember ``reason`` as ``url``'s latest failure without counting it (a probe of an engine already out)."""
        if url.rstrip("/") in self._engines:
            self._engine(url).last_failure = reason

    def trip(self, url: str, reason: str) -> None:
        """Open ``url``'s breaker now (its process exited); its generate attempts end at once."""
        engine = self._engine(url)
        engine.cause = engine.last_failure = reason
        if engine.breaker.trip():
            self.end_attempts(engine.client.url, reason)
            self._notify_down(url, reason)

    def retire(self, url: str, reason: str) -> None:
        """Out of rotation for the rest of the run (the supervisor gave up on it): generates stop waiting for it."""
        engine = self._engine(url)
        engine.in_rotation, engine.retired = False, True
        engine.out_reason = engine.cause = reason
        self.end_attempts(engine.client.url, reason)
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        """Wake the generate calls waiting for a worker (one came back, or one was given up on)."""
        event, self._rotation_event = self._rotation_event, asyncio.Event()
        event.set()
        self._outage_logged, self._diagnosis = False, None  # a new outage gets a new diagnosis

    def _notify_down(self, url: str, reason: str) -> None:
        if self.on_engine_down is not None:
            self.on_engine_down(url.rstrip("/"), reason)

    def all_retired(self) -> bool:
        """Every worker was given up on for good (none may come back)."""
        return all(e.retired for e in self._engines.values())

    async def engines_gone(self, waited_s: float, endpoint: str = "/generate") -> EnginesGone:
        """The ``EnginesGone`` for now: one line naming each worker and why it is out (module docstring).
        The calls that give up together share one diagnosis (one probe per worker, one message)."""
        if self._diagnosis is None:
            self._diagnosis = asyncio.ensure_future(self._diagnose(waited_s, endpoint))
        message, reasons = await asyncio.shield(self._diagnosis)  # a cancelled caller leaves it to the others
        return EnginesGone(message, reasons=reasons, endpoint=endpoint)

    async def _diagnose(self, waited_s: float, endpoint: str) -> tuple[str, dict[str, str]]:
        engines = list(self._engines.values())
        whys = await asyncio.gather(*(self._why_out(e) for e in engines))
        reasons = {e.client.url: why for e, why in zip(engines, whys)}
        waited = "every one was given up on" if self.all_retired() else f"none came back within {waited_s:g}s"
        line = "; ".join(f"engine {url}: {why}" for url, why in reasons.items()) or "the pool has no engine"
        return f"no engine left to serve {endpoint} ({waited}): {line}", reasons

    async def _why_out(self, engine: PoolEngine) -> str:
        if await refuses_connections(engine.client.url):
            return "dead (connection refused: nothing listens there)" + (f"; {_cut(engine.cause)}" if engine.cause else "")
        reason = engine.cause or engine.last_failure or engine.out_reason or f"circuit breaker {engine.breaker.state.value}"
        return f"{_cut(reason)} (no successful answer for {time.monotonic() - engine.answered_at:.0f}s)"


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 3] + "..."
