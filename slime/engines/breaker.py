"""``CircuitBreaker``: one per engine, so a failing or flapping engine stops getting traffic.

::

    CLOSED ──K consecutive failures──► OPEN ──cooldown elapsed──► HALF_OPEN (one probe at a time)
      ▲                                  ▲                            │
      └──────────── probe succeeds ──────┼────────────────────────────┤
                                         └──── probe fails (cooldown doubles, up to max) ┘

A failure is an ``EngineUnavailable`` or ``EngineTimeout`` from that engine, or a failed health
check; any answer from the engine (even a 4xx) is a success. ``trip()`` opens the breaker at once
(the engine's process is gone). Example, ``failure_threshold=3, cooldown_s=5, max_cooldown_s=40``:
three connection resets open it; 5 s later one request is let through as a probe; it fails, so the
next probe waits 10 s, then 20, then 40, 40, ...; the first success closes it and resets the cooldown.

Not covered: the breaker does not decide about restarts or weight syncs (``EngineSupervisor`` does);
it is a pure state machine with an injectable clock, not thread-safe (one event loop).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Per-engine failure accounting.

    Args:
        failure_threshold: K, consecutive failures that open a closed breaker (>= 1).
        cooldown_s: first wait in OPEN before a probe is allowed (> 0).
        max_cooldown_s: bound on the doubled cooldown; default ``8 * cooldown_s``.
        clock: monotonic seconds (tests pass a fake).

    Raises:
        ValueError: a threshold below 1 or a non-positive cooldown.
    """

    def __init__(
        self,
        *,
        failure_threshold: int,
        cooldown_s: float,
        max_cooldown_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        if cooldown_s <= 0:
            raise ValueError(f"cooldown_s must be > 0, got {cooldown_s}")
        self.failure_threshold = failure_threshold
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max(cooldown_s, max_cooldown_s if max_cooldown_s is not None else 8 * cooldown_s)
        self.cooldown_s = cooldown_s
        """Current cooldown: ``base_cooldown_s * 2**(failed probes)``, at most ``max_cooldown_s``."""
        self.num_consecutive_failures = 0
        self.num_opens = 0
        """How many times the breaker went from CLOSED (or HALF_OPEN) to OPEN."""
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._opened_at = 0.0
        self._probe_started: float | None = None

    def __repr__(self) -> str:
        return f"CircuitBreaker({self.state.value}, failures={self.num_consecutive_failures}, cooldown_s={self.cooldown_s})"

    @property
    def state(self) -> BreakerState:
        """The state now; OPEN reads as HALF_OPEN once the cooldown has elapsed."""
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.cooldown_s:
            self._state = BreakerState.HALF_OPEN
            self._probe_started = None
        return self._state

    def available(self) -> bool:
        """Would a request be let through now? No side effect (see ``begin``).

        CLOSED: yes. OPEN: no. HALF_OPEN: yes if no probe is out, or the probe has been out for longer
        than the cooldown (its caller vanished without reporting).
        """
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        return self._probe_started is None or self._clock() - self._probe_started >= self.cooldown_s

    def begin(self) -> None:
        """A request is being sent; in HALF_OPEN it becomes the one probe."""
        if self.state is BreakerState.HALF_OPEN:
            self._probe_started = self._clock()

    def record_success(self) -> None:
        """The engine answered: close, reset the count and the cooldown."""
        self._state = BreakerState.CLOSED
        self.num_consecutive_failures = 0
        self.cooldown_s = self.base_cooldown_s
        self._probe_started = None

    def record_failure(self) -> bool:
        """The engine failed. Returns True if this call opened the breaker."""
        self.num_consecutive_failures += 1
        state = self.state
        if state is BreakerState.HALF_OPEN:
            self.cooldown_s = min(self.cooldown_s * 2, self.max_cooldown_s)
            self._open()
            return True
        if state is BreakerState.CLOSED and self.num_consecutive_failures >= self.failure_threshold:
            self._open()
            return True
        return False

    def trip(self) -> bool:
        """Open now, whatever the count (the engine's process exited). Returns True if it was not open."""
        was_open = self.state is BreakerState.OPEN
        self._open()
        return not was_open

    def _open(self) -> None:
        if self._state is not BreakerState.OPEN:
            self.num_opens += 1
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._probe_started = None
