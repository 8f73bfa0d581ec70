"""``Workers``: the workers of ``HttpEnginePool``: which are in rotation, which one a generate goes to,
each one's breaker and last failure, and why they are out.

Routing (``pick``): a ``sticky_key`` goes back to the engine it went to last while that engine is in
rotation with a closed breaker; otherwise the engine with the fewest in-flight generates wins
(engines with a recent failure last; ties: the one picked least often).

Every failure of a worker (a ``/generate`` or control call that got no answer, a failed health
check) is recorded with its reason; every answer resets it. When a worker's breaker opens, its
process exits (``trip``), it is taken out of rotation or given up on for good (``retire``), the
generate attempts still on it end at once and are retried elsewhere (``Attempts.end``):
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
import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TypedDict

from slime.engines.breaker import BreakerState, CircuitBreaker
from slime.engines.client import EngineClient
from slime.engines.pool_timeouts import AbortWatch
from slime.engines.probe import refuses_connections
from slime.errors import EngineError, EnginesGone

__all__ = ["PoolEngine", "EngineState", "Workers", "failure_text"]

log = logging.getLogger("slime.engines.pool")  # the pool's logger
_MAX_REASON_CHARS = 240  # one engine's part of the EnginesGone line
_MAX_STICKY_KEYS = 65536  # least recently used keys are forgotten past this


class EngineState(TypedDict):
    """One worker's health as a JSON-able row (``HttpEnginePool.engine_states``)."""

    url: str
    in_rotation: bool
    out_reason: str
    breaker: str
    """``closed``, ``open`` or ``half_open`` (``BreakerState``)."""
    consecutive_failures: int
    num_inflight: int
    num_picks: int
    last_failure: str
    retired: bool


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


class Workers:
    """The pool's workers by url, in pool order, with their health (module docstring).

    Args:
        failure_threshold / breaker_cooldown_s: each worker's breaker (K, first cooldown).
        rejoin_timeout_s: how long ``pick_or_wait`` waits when no worker is in rotation (0: fail at once).
        end_attempts: ends the generate attempts on a url (``Attempts.end``) when its worker leaves rotation.
    """

    def __init__(
        self,
        *,
        failure_threshold: int,
        breaker_cooldown_s: float,
        rejoin_timeout_s: float,
        end_attempts: Callable[[str, str], None],
    ):
        self.failure_threshold = failure_threshold
        self.breaker_cooldown_s = breaker_cooldown_s
        self.rejoin_timeout_s = rejoin_timeout_s
        self.on_engine_down: Callable[[str, str], None] | None = None
        """Hears ``(url, reason)`` of every breaker that opens and every worker taken out (the supervisor)."""
        self._end_attempts = end_attempts
        self._engines: dict[str, PoolEngine] = {}
        self._sticky: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._rotation_event = asyncio.Event()
        self._outage_logged = False
        self._diagnosis: asyncio.Future[tuple[str, dict[str, str]]] | None = (
            None  # why every engine is out (``engines_gone``)
        )

    # -- membership ------------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Every worker, in rotation or not."""
        return list(self._engines)

    @property
    def clients(self) -> list[EngineClient]:
        """Workers in rotation."""
        return [e.client for e in self._engines.values() if e.in_rotation]

    @property
    def num_inflight(self) -> int:
        return sum(e.client.num_inflight for e in self._engines.values())

    def __contains__(self, url: str) -> bool:
        return url.rstrip("/") in self._engines

    def add(self, client: EngineClient) -> None:
        """Start routing to ``client``. Raises ValueError if its url is already in the pool."""
        if client.url in self._engines:
            raise ValueError(f"engine {client.url} is already in the pool")
        breaker = CircuitBreaker(failure_threshold=self.failure_threshold, cooldown_s=self.breaker_cooldown_s)
        self._engines[client.url] = PoolEngine(client, breaker)

    def get(self, url: str, *, pop: bool = False) -> PoolEngine:
        """The worker at ``url`` (removed with ``pop``). Raises KeyError if unknown."""
        key = url.rstrip("/")
        if key not in self._engines:
            raise KeyError(f"engine {key} is not in the pool (have {self.urls})")
        return self._engines.pop(key) if pop else self._engines[key]

    def states(self) -> list[EngineState]:
        """One row per worker, in pool order."""
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

    # -- routing ---------------------------------------------------------------------------------

    def pick(self, sticky_key: str | None, tried: set[str]) -> PoolEngine | None:
        """The worker for the next attempt (module docstring), None with none in rotation."""
        rotation = [e for e in self._engines.values() if e.in_rotation]
        if not rotation:
            return None
        if sticky_key is not None and not tried:
            engine = self._engines.get(self._sticky.get(sticky_key, ""))
            if engine is not None and engine.in_rotation and engine.breaker.state is BreakerState.CLOSED:
                return engine
        candidates = [e for e in rotation if e.client.url not in tried] or rotation
        candidates = [e for e in candidates if e.breaker.available()] or candidates
        return min(
            candidates, key=lambda e: (e.breaker.num_consecutive_failures > 0, e.client.num_inflight, e.num_picks)
        )

    async def pick_or_wait(self, sticky_key: str | None, tried: set[str], abort: AbortWatch) -> PoolEngine | None:
        """A worker to try; None if ``abort_all`` came while waiting for one to rejoin.

        Raises:
            EnginesGone: no worker came back within ``rejoin_timeout_s``, or every one was given up on.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        while (engine := self.pick(sticky_key, tried)) is None:
            left = start + self.rejoin_timeout_s - loop.time()
            if not self._engines or left <= 0 or self.all_retired():
                raise await self.engines_gone(self.rejoin_timeout_s)
            if not self._outage_logged:  # once per outage: a wait is never silent, nor one line per request
                self._outage_logged = True
                log.warning(
                    "no engine in rotation: waiting up to %.0fs for one to come back (%s)", left, self._out_summary()
                )
            await abort.sleep(left, wake=self._rotation_event)
            if abort.fired:
                return None
        return engine

    def bind_sticky(self, key: str, url: str) -> None:
        """Send ``key``'s later turns to ``url`` (bound when picked, so concurrent turns share an engine)."""
        self._sticky[key] = url
        self._sticky.move_to_end(key)
        if len(self._sticky) > _MAX_STICKY_KEYS:
            self._sticky.popitem(last=False)

    def _out_summary(self) -> str:
        return "; ".join(
            f"{e.client.url}: {e.out_reason or e.last_failure or 'breaker open'}" for e in self._engines.values()
        )

    # -- health ----------------------------------------------------------------------------------

    def record_success(self, url: str) -> None:
        """``url`` answered: close its breaker, forget its last failure."""
        engine = self.get(url)
        engine.breaker.record_success()
        engine.answered_at, engine.last_failure = time.monotonic(), ""

    def record_failure(self, url: str, reason: str) -> None:
        """Count a failure of ``url``; if its breaker opens, end its generate attempts and tell ``on_engine_down``."""
        if url not in self:
            return
        engine = self.get(url)
        engine.last_failure = reason
        if engine.breaker.record_failure():
            log.warning("engine %s: circuit breaker open after %s", engine.client.url, reason)
            self._end_attempts(engine.client.url, f"its circuit breaker opened after {reason}")
            self._notify_down(url, reason)

    def note_failure(self, url: str, reason: str) -> None:
        """Remember ``reason`` as ``url``'s latest failure without counting it (a probe of an engine already out)."""
        if url in self:
            self.get(url).last_failure = reason

    def trip(self, url: str, reason: str) -> None:
        """Open ``url``'s breaker now (its process exited); its generate attempts end at once."""
        engine = self.get(url)
        engine.cause = engine.last_failure = reason
        if engine.breaker.trip():
            self._end_attempts(engine.client.url, reason)
            self._notify_down(url, reason)

    def take_out(self, url: str, reason: str) -> bool:
        """Out of rotation until ``put_back``; its generate attempts end now and are retried elsewhere.
        Returns False if it was already out."""
        engine = self.get(url)
        if not engine.in_rotation:
            return False
        engine.in_rotation, engine.out_reason = False, reason
        log.warning("engine %s taken out of rotation: %s", engine.client.url, reason)
        self._end_attempts(engine.client.url, f"taken out of rotation: {reason}")  # not waited for until their timeout
        self._notify_down(engine.client.url, reason)
        return True

    def put_back(self, url: str) -> None:
        """Back in rotation, healthy (the end of a rejoin; the caller then wakes the waiters)."""
        engine = self.get(url)
        self.record_success(url)
        engine.in_rotation, engine.out_reason, engine.retired, engine.cause = True, "", False, ""

    def retire(self, url: str, reason: str) -> None:
        """Out of rotation for the rest of the run (the supervisor gave up on it): generates stop waiting for it."""
        engine = self.get(url)
        engine.in_rotation, engine.retired = False, True
        engine.out_reason = engine.cause = reason
        self._end_attempts(engine.client.url, reason)
        self.wake_waiters()

    def wake_waiters(self) -> None:
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

    # -- why they are out ------------------------------------------------------------------------

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
            return "dead (connection refused: nothing listens there)" + (
                f"; {_cut(engine.cause)}" if engine.cause else ""
            )
        reason = (
            engine.cause or engine.last_failure or engine.out_reason or f"circuit breaker {engine.breaker.state.value}"
        )
        return f"{_cut(reason)} (no successful answer for {time.monotonic() - engine.answered_at:.0f}s)"


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 3] + "..."
