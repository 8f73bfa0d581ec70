"""Counters of the simulated engine (``GET /sim_stats``, ``SimEngine.stats()``).

The benchmark's slot utilisation comes from here, not from the client: the time-average of running
requests is integrated over decode steps (``running x step duration``) and divided by the elapsed
simulated time, idle time included. Example: max_running_requests 4; 4 requests run for 10 simulated s, then
the engine idles 10 s -> running_integral_s = 40, elapsed 20 s -> mean_running = 2,
mean_running_busy = 4, slot_utilization = 0.5.

Simulated vs wall: ``*_sim_*`` values are simulated time (wall x time_scale); ``*_wall_*`` values
are measured on the monotonic clock of the engine's process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgspec

from slime.servers.sim.config import SimConfig

__all__ = ["SimCounters", "SimStats"]


class SimStats(msgspec.Struct, kw_only=True, frozen=True):
    """A snapshot of the counters since start or the last reset.

    Attributes:
        elapsed_wall_s: wall seconds since start / reset.
        busy_sim_s: simulated seconds spent in decode steps (>= 1 request running).
        busy_wall_s: wall seconds those steps actually took (sleep included; > busy_sim_s / time_scale
            when the loop ran late).
        running_integral_s: sum over steps of running requests x step duration, request-simulated-seconds.
        elapsed_sim_s: busy_sim_s + (elapsed_wall_s - busy_wall_s) x time_scale: simulated time since
            start / reset, idle time included (= elapsed_wall_s x time_scale when the loop keeps up).
        mean_running: running_integral_s / elapsed_sim_s.
        mean_running_busy: running_integral_s / busy_sim_s (0 when never busy).
        slot_utilization: mean_running / max_running_requests.
        num_steps: decode steps run.
        tokens_generated: output tokens produced (aborted requests' tokens included).
        prefill_tokens: tokens prefilled on admission (prompts plus re-sent partial responses).
        requests_finished: requests that ended with stop or length.
        requests_aborted: aborted requests (abort calls, pauses, cancelled callers, shutdown).
        num_running / num_waiting: now (frozen requests of an in_place pause count as running).
        paused: whether generation is paused now.
        weight_version: the current version.
        num_weight_updates: completed ``update_weights_from_disk`` calls.
        weight_sync_wall_s: wall seconds spent loading weights (the ``weight_sync_ms`` part only).
        max_step_lag_ms: the latest a step ended past its deadline, wall ms (loop overload indicator).
        time_scale / max_running_requests: the engine's settings, for the reader's convenience.
    """

    elapsed_wall_s: float
    elapsed_sim_s: float
    busy_sim_s: float
    busy_wall_s: float
    running_integral_s: float
    mean_running: float
    mean_running_busy: float
    slot_utilization: float
    num_steps: int
    tokens_generated: int
    prefill_tokens: int
    requests_finished: int
    requests_aborted: int
    num_running: int
    num_waiting: int
    paused: bool
    weight_version: str
    num_weight_updates: int
    weight_sync_wall_s: float
    max_step_lag_ms: float
    time_scale: float
    max_running_requests: int


@dataclass
class SimCounters:
    """The mutable accumulators behind ``SimStats`` (owned by the engine's step loop)."""

    started_s: float
    busy_sim_ms: float = 0.0
    busy_wall_s: float = 0.0
    running_integral_ms: float = 0.0
    num_steps: int = 0
    tokens_generated: int = 0
    prefill_tokens: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    num_weight_updates: int = 0
    weight_sync_wall_s: float = 0.0
    max_step_lag_s: float = 0.0

    def snapshot(
        self, config: SimConfig, *, num_running: int, num_waiting: int, paused: bool, weight_version: str
    ) -> SimStats:
        elapsed = time.monotonic() - self.started_s
        elapsed_sim_ms = self.busy_sim_ms + max(0.0, elapsed - self.busy_wall_s) * 1000.0 * config.time_scale
        mean_running = self.running_integral_ms / elapsed_sim_ms if elapsed_sim_ms > 0 else 0.0
        return SimStats(
            elapsed_wall_s=elapsed,
            elapsed_sim_s=elapsed_sim_ms / 1000.0,
            busy_sim_s=self.busy_sim_ms / 1000.0,
            busy_wall_s=self.busy_wall_s,
            running_integral_s=self.running_integral_ms / 1000.0,
            mean_running=mean_running,
            mean_running_busy=self.running_integral_ms / self.busy_sim_ms if self.busy_sim_ms > 0 else 0.0,
            slot_utilization=mean_running / config.max_running_requests,
            num_steps=self.num_steps,
            tokens_generated=self.tokens_generated,
            prefill_tokens=self.prefill_tokens,
            requests_finished=self.requests_finished,
            requests_aborted=self.requests_aborted,
            num_running=num_running,
            num_waiting=num_waiting,
            paused=paused,
            weight_version=weight_version,
            num_weight_updates=self.num_weight_updates,
            weight_sync_wall_s=self.weight_sync_wall_s,
            max_step_lag_ms=self.max_step_lag_s * 1000.0,
            time_scale=config.time_scale,
            max_running_requests=config.max_running_requests,
        )
