"""The discrete-step scheduler inside ``SimEngine``: queues, the step loop and the weight-version log.

One loop task runs steps, each ``a + b * running + c * prefill_tokens`` simulated ms long
(``SimConfig.step_ms``), slept as that / ``time_scale`` wall seconds against a monotonic deadline
(a late wake-up shortens the next sleep, so simulated time does not drift from wall time)::

    wait until something can run -> admit waiting requests FIFO up to max_running_requests
    -> sleep the step -> every running request gains one token -> finish those at their target

A request admitted in step k produces its first token in step k (prefill samples it) and its last in
step k + num_new - 1. That finishing step is fixed on admission and kept in a heap, so a step costs
O(admitted + finishing), not O(running). Example: a=8, b=0, c=0, scale 1, one request of 10 tokens:
admitted at step 0, finishes after step 9, 80 ms after it arrived.

Per-token weight versions come from a log of (first step, version): a token made in step s has the
version in force when s began. Tokens are drawn only when a caller reads the result (``SimOutput``).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import heapq
import time
from dataclasses import dataclass, field
from typing import Any

from slime.engines.protocol import FinishReason, GenerateResult
from slime.servers.sim.config import SimConfig
from slime.servers.sim.stats import SimCounters
from slime.servers.sim.trajectory import Trajectory, TrajectoryTracker
from slime.types import JsonObject

__all__ = ["SimRequest", "SimOutput", "StepScheduler", "WAITING", "RUNNING", "DONE"]

WAITING, RUNNING, DONE = 0, 1, 2


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request. ``produced``/``spans`` hold the tokens of running stints before a retract."""

    rid: str
    seq: int  # arrival order; the weight-update barrier compares it
    traj: Trajectory
    input_len: int
    already: int  # response tokens carried in input_ids
    num_new: int  # tokens to produce in this request (>= 1 once queued)
    reason: dict[str, Any]  # the finish reason once num_new tokens are made
    return_logprob: bool
    future: asyncio.Future
    created_s: float = field(default_factory=time.perf_counter)
    state: int = WAITING
    produced: int = 0
    spans: list[list[Any]] = field(default_factory=list)  # [[version, count]]
    admit_step: int = 0
    finish_step: int = 0
    num_retractions: int = 0


@dataclass(frozen=True, slots=True)
class SimOutput:
    """A finished or aborted request; ``tokens()`` draws its ids and logprobs on demand.

    Attributes:
        start: response position of the first output token (= tokens carried in ``input_ids``).
        num_tokens: output tokens.
        finish_reason: the docs/sglang.md#finish-reason object (a queued abort has no ``status_code``/``err_type``).
        spans: [(version, start, end)] tiling [0, num_tokens); ``[(current, 0, 0)]`` when empty.
        prompt_tokens: ``len(input_ids)``; None for a queued abort (docs/sglang.md#abort, case B).
        e2e_latency: wall seconds from arrival to finish.
    """

    rid: str
    traj: Trajectory
    tracker: TrajectoryTracker
    start: int
    num_tokens: int
    finish_reason: dict[str, Any]
    spans: list[tuple[str, int, int]]
    prompt_tokens: int | None
    return_logprob: bool
    e2e_latency: float
    num_retractions: int

    @property
    def queued_abort(self) -> bool:
        return self.prompt_tokens is None

    def tokens(self) -> tuple[list[int], list[float]]:
        """([num_tokens] ids, [num_tokens] logprobs, or [] without ``return_logprob``)."""
        return self.tracker.tokens(self.traj, self.start, self.start + self.num_tokens, logprobs=self.return_logprob)

    def to_result(self) -> GenerateResult:
        """The ``GenerateResult`` that parsing this request's HTTP response would give."""
        ids, lps = self.tokens()
        return GenerateResult(
            output_ids=ids,
            output_logprobs=lps,
            finish_reason=FinishReason(**self.finish_reason),
            weight_version=self.spans[-1][0],
            token_weight_versions=[v for v, s, e in self.spans for _ in range(e - s)],
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.num_tokens,
            cached_tokens=None if self.queued_abort else 0,
            e2e_latency=self.e2e_latency,
            rid=self.rid,
        )


class StepScheduler:
    """Owns the waiting queue, the running set, the finish heap and the version log.

    ``SimEngine`` decides *what* to do (validation, abort matching, weight-update waits); this class
    does it between steps. Everything runs on one event loop, so no locks are needed.
    """

    def __init__(self, config: SimConfig, tracker: TrajectoryTracker):
        self.config = config
        self.tracker = tracker
        self.counters = SimCounters(started_s=time.monotonic())
        self.inflight: dict[str, SimRequest] = {}
        self.running: dict[int, SimRequest] = {}
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.paused = False
        self.syncing = False
        self.barrier: int | None = None  # requests with seq >= barrier wait for a weight update
        self.closed = False
        self.wake = asyncio.Event()  # something may be able to run
        self.changed = asyncio.Event()  # a request left, or generation paused
        self._heap: list[tuple[int, int, SimRequest]] = []
        self._step = 0  # completed steps
        self._in_step = False
        self._version_steps, self._version_names = [0], [config.weight_version]

    @property
    def weight_version(self) -> str:
        return self._version_names[-1]

    def add(self, req: SimRequest) -> None:
        """Queue ``req`` (instant mode, nothing ahead: finish it now)."""
        self.inflight[req.rid] = req
        if req.num_new == 0 or (self.config.instant and not self.waiting and self.admissible(req)):
            self.finish(req, req.reason, req.num_new)
        else:
            self.waiting.append(req)
            self.wake.set()

    def admissible(self, req: SimRequest) -> bool:
        return not (self.paused or self.syncing or (self.barrier is not None and req.seq >= self.barrier))

    def _can_step(self) -> bool:
        if self.paused or self.syncing:
            return False
        return (
            bool(self.running)
            or bool(self.waiting)
            and self.admissible(self.waiting[0])
            and (self.config.instant or len(self.running) < self.config.max_running_requests)
        )

    def _admit(self) -> int:
        """Move waiting requests to running (FIFO, up to the cap); returns the tokens to prefill."""
        prefill, cap, instant = 0, self.config.max_running_requests, self.config.instant
        while self.waiting and (instant or len(self.running) < cap) and self.admissible(self.waiting[0]):
            req = self.waiting.popleft()
            if instant:
                self.finish(req, req.reason, req.num_new - req.produced)
                continue
            req.state, req.admit_step = RUNNING, self._step
            req.finish_step = self._step + req.num_new - req.produced - 1
            heapq.heappush(self._heap, (req.finish_step, req.seq, req))
            self.running[req.seq] = req
            prefill += req.input_len + req.produced
        return prefill

    async def run(self) -> None:
        """The step loop; returns once ``closed`` is set and ``wake`` is signalled."""
        loop = asyncio.get_running_loop()
        wall_per_ms = 1.0 / 1000.0 / self.config.time_scale
        deadline: float | None = None
        while not self.closed:
            if not self._can_step():
                deadline = None
                self.wake.clear()
                await self.wake.wait()
                continue
            prefill = self._admit()
            num_running = len(self.running)
            if not num_running:
                continue
            step_ms = self.config.step_ms(num_running, prefill)
            begin = loop.time()
            deadline = (begin if deadline is None else deadline) + step_ms * wall_per_ms
            self._in_step = True
            await asyncio.sleep(max(0.0, deadline - begin))
            self._in_step = False
            end = loop.time()
            c = self.counters
            c.max_step_lag_s = max(c.max_step_lag_s, end - deadline)
            c.busy_wall_s += end - begin
            c.num_steps += 1
            c.busy_sim_ms += step_ms
            c.running_integral_ms += num_running * step_ms
            c.prefill_tokens += prefill
            c.tokens_generated += len(self.running)  # aborted mid-step: that step's token is dropped
            self._step += 1
            heap = self._heap
            while heap and heap[0][0] < self._step:
                finish_step, _, req = heapq.heappop(heap)
                if req.state == RUNNING and req.finish_step == finish_step:  # else aborted or retracted
                    self.finish(req, req.reason, self._step - req.admit_step)

    def set_version(self, version: str) -> None:
        """Tokens of steps not yet begun carry ``version``."""
        at = self._step + (1 if self._in_step else 0)
        if self._version_steps[-1] == at:
            self._version_names[-1] = version
        else:
            self._version_steps.append(at)
            self._version_names.append(version)

    def _spans(self, first_step: int, count: int) -> list[list[Any]]:
        """[[version, n]] of the tokens made in steps [first_step, first_step + count)."""
        out: list[list[Any]] = []
        i = bisect.bisect_right(self._version_steps, first_step) - 1
        pos, end = first_step, first_step + count
        while pos < end:
            stop = min(end, self._version_steps[i + 1]) if i + 1 < len(self._version_steps) else end
            out.append([self._version_names[i], stop - pos])
            pos, i = stop, i + 1
        return out

    def retract(self) -> None:
        """Send every running request back to the queue head (keeping its tokens), in admission order."""
        back = list(self.running.values())
        self.running.clear()
        for req in back:
            req.spans += self._spans(req.admit_step, self._step - req.admit_step)
            req.produced += self._step - req.admit_step
            req.state, req.num_retractions = WAITING, req.num_retractions + 1
        self.waiting.extendleft(reversed(back))

    def abort(self, reqs: list[SimRequest], message: str) -> None:
        """Running requests end with their tokens (docs/sglang.md#abort, case A); queued ones get the B shape."""
        queued = False
        for req in reqs:
            if req.state == RUNNING:
                self.finish(
                    req,
                    {"type": "abort", "message": message, "status_code": None, "err_type": None},
                    self._step - req.admit_step,
                )
            elif req.state == WAITING:
                queued = True
                msg = "Abort in waiting queue" if message == "Aborted" else message
                self.finish(req, {"type": "abort", "message": msg}, 0, queued=True)
        if queued:
            self.waiting = collections.deque(r for r in self.waiting if r.state == WAITING)
        self.wake.set()

    def finish(self, req: SimRequest, reason: JsonObject, num_now: int, *, queued: bool = False) -> None:
        """Close ``req`` with ``num_now`` tokens from its current stint (plus earlier stints)."""
        if req.state == RUNNING:
            del self.running[req.seq]
            first_step = req.admit_step
        else:
            first_step = self._step
        req.state = DONE
        del self.inflight[req.rid]
        merged: list[tuple[str, int, int]] = []
        pos = 0
        for version, n in req.spans + self._spans(first_step, num_now):
            if merged and merged[-1][0] == version:
                merged[-1] = (version, merged[-1][1], pos + n)
            else:
                merged.append((version, pos, pos + n))
            pos += n
        c = self.counters
        if reason["type"] == "abort":
            c.requests_aborted += 1
        else:
            c.requests_finished += 1
            if self.config.instant:
                c.tokens_generated += num_now
        out = SimOutput(
            rid=req.rid,
            traj=req.traj,
            tracker=self.tracker,
            start=req.already,
            num_tokens=pos,
            finish_reason=reason,
            spans=merged or [(self.weight_version, 0, 0)],
            prompt_tokens=None if queued else req.input_len,
            return_logprob=req.return_logprob,
            e2e_latency=round(time.perf_counter() - req.created_s, 6),
            num_retractions=req.num_retractions,
        )
        if not req.future.done():
            req.future.set_result(out)
        self.changed.set()
