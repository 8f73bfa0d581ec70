"""Engine occupancy measured from the client side, the same way for a real and a simulated engine.

A real SGLang has no ``/sim_stats``, so the benchmark counts what it can see: the ``/generate``
calls it has in flight. An engine runs at most ``cap`` (``--max-running-requests``) of them; the
rest wait in its queue. Occupancy over a window is::

    occupancy = (1 / (cap * T)) * integral over the window of min(requests in flight, cap) dt

with time paused in place counted as 0 (nothing decodes then, although requests stay in flight).
``busy_fraction`` is the share of the window with at least one request running (and not paused).

It over-states the engine's own figure by the HTTP round trip and the response transfer of each
request (~1 ms against responses of seconds here); ``tests/bench`` checks it against the simulated
engine's ``/sim_stats`` ``mean_running / max_running_requests``.

Example: cap 4; 2 requests for 1 s, then 6 for 1 s: (2 * 1 + 4 * 1) / (4 * 2) = 0.75.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["OccupancyMeter"]


class OccupancyMeter:
    """Integrates ``min(in flight, cap)`` over time. Not thread-safe (one event loop).

    Args:
        cap: the engine's running-request cap (sum over engines), >= 1.
        clock: monotonic seconds (injectable for tests).

    Raises:
        ValueError: ``cap < 1``.
    """

    def __init__(self, cap: int, *, clock: Callable[[], float] = time.monotonic):
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap, self._clock = cap, clock
        self.num_inflight = 0
        self.paused = False
        self._last = self._start = clock()
        self._area = 0.0  # request-seconds, capped
        self._busy_s = 0.0

    def _advance(self) -> None:
        now = self._clock()
        if not self.paused and self.num_inflight > 0:
            self._area += min(self.num_inflight, self.cap) * (now - self._last)
            self._busy_s += now - self._last
        self._last = now

    def reset(self) -> None:
        """Start a new window now (requests in flight stay counted)."""
        self._advance()
        self._start, self._area, self._busy_s = self._last, 0.0, 0.0

    def add(self, delta: int) -> None:
        """``+1`` when a request is sent, ``-1`` when its response is in."""
        self._advance()
        self.num_inflight += delta

    def set_paused(self, paused: bool) -> None:
        """Engines paused in place (requests kept, nothing decoding) or continued."""
        self._advance()
        self.paused = paused

    def occupancy(self) -> float:
        """Time-average of min(in flight, cap) / cap since the window began, in [0, 1]."""
        self._advance()
        elapsed = self._last - self._start
        return self._area / (self.cap * elapsed) if elapsed > 0 else 0.0

    def busy_fraction(self) -> float:
        """Share of the window with >= 1 request in flight and not paused, in [0, 1]."""
        self._advance()
        elapsed = self._last - self._start
        return self._busy_s / elapsed if elapsed > 0 else 0.0
