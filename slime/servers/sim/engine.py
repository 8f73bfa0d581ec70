"""``SimEngine``: an SGLang-like engine with no model, for timing studies on a CPU (pure asyncio).

The public, in-process face of the simulation (``server.py`` serves the same object over HTTP):
``generate`` / ``submit`` validate a request, fix its trajectory (``trajectory.py``: total length,
tokens) and hand it to the ``StepScheduler`` (``scheduler.py``: queue, steps, versions), which
resolves it when the trajectory reaches its length, ``max_new_tokens`` runs out, or it is aborted.

Control, with SGLang's semantics (docs/sglang.md#abort, #pause): ``abort`` (the rid must be in flight exactly, then
every rid starting with it is aborted) / ``abort_all``; ``pause_generation`` abort | retract (running
requests go back to the queue head with their tokens, re-prefilled on continue) | in_place (steps
stop, progress kept); requests arriving while paused wait. ``update_weights_from_disk`` waits for
the requests in flight unless paused or ``abort_all_requests`` (later ones are held), then takes
``weight_sync_ms``; a request paused in place across it gets a ``weight_versions`` span per version.

Departures from SGLang: an abort takes effect at once, dropping the token of the step in progress
(SGLang keeps it); stop strings, ``stop_token_ids``, ``ignore_eos``, ``min_new_tokens``, ``n > 1``,
temperature and the prefix cache are not simulated (``cached_tokens`` is always 0);
``e2e_latency`` is wall seconds; ``/health_generate`` answers at once even while paused.

Example (resume)::

    async with SimEngine(SimConfig(time_scale=1000)) as eng:
        a = await eng.generate(prompt, {"max_new_tokens": 5, "sampling_seed": 7})       # length, 5 tokens
        b = await eng.generate(prompt + a.output_ids, {"max_new_tokens": 9999, "sampling_seed": 7})
        # a.output_ids + b.output_ids == the tokens of one uninterrupted request
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from slime.engines.protocol import GenerateResult
from slime.servers.sim.config import SimConfig
from slime.servers.sim.lengths import make_length_distribution
from slime.servers.sim.scheduler import SimOutput, SimRequest, StepScheduler
from slime.servers.sim.stats import SimCounters, SimStats
from slime.servers.sim.trajectory import TrajectoryTracker
from slime.types import JsonObject

__all__ = ["SimEngine", "SimOutput", "DEFAULT_MAX_NEW_TOKENS"]

DEFAULT_MAX_NEW_TOKENS = 128
"""SGLang's default when ``sampling_params`` has no ``max_new_tokens`` (docs/sglang.md#generate-request)."""


class SimEngine:
    """The simulation core; an async context manager that owns its step-loop task.

    Control methods are synchronous (they take effect before returning) except
    ``update_weights_from_disk``, which waits as SGLang does. Counters: ``stats()`` / ``reset_stats()``.

    Raises:
        ConfigError: an unreadable ``response_len_file``.
    """

    def __init__(self, config: SimConfig):
        self.config = config
        self.tracker = TrajectoryTracker(config, make_length_distribution(config))
        self.model_path = config.model_path
        self._sched = StepScheduler(config, self.tracker)
        self._update_lock = asyncio.Lock()
        self._next_seq = 0
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> SimEngine:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def start(self) -> None:
        """Start the step loop on the running event loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sched.run(), name="slime-sim-steps")

    async def close(self) -> None:
        """Abort everything in flight ("The engine is shutting down."), stop the loop. Idempotent."""
        self._sched.closed = True
        self._sched.abort(list(self._sched.inflight.values()), "The engine is shutting down.")
        if self._task is not None:
            await self._task

    @property
    def weight_version(self) -> str:
        return self._sched.weight_version

    @property
    def paused(self) -> bool:
        return self._sched.paused

    @property
    def num_running(self) -> int:
        return len(self._sched.running)

    @property
    def num_waiting(self) -> int:
        return len(self._sched.waiting)

    # ---- generation ------------------------------------------------------------------------------
    def submit(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any] | None = None,
        rid: str | None = None,
        *,
        return_logprob: bool = True,
    ) -> asyncio.Future:
        """Queue one request; the returned future resolves to its ``SimOutput``.

        Honoured ``sampling_params``: ``max_new_tokens`` (default 128; null = ``max_response_len``),
        ``sampling_seed`` (trajectory identity, see ``trajectory.py``), ``n`` (must be 1).

        Raises:
            ValueError: empty or negative ``input_ids``, ``n != 1``, a rid already in flight, a
                negative ``max_new_tokens``, or the engine is closed (SGLang's 400 cases).
        """
        if self._sched.closed:
            raise ValueError("The engine is shutting down.")
        sp = sampling_params or {}
        ids = list(input_ids)
        if not ids:
            raise ValueError("input_ids cannot be empty.")
        if min(ids) < 0:
            raise ValueError(f"Token id {min(ids)} is negative.")
        if sp.get("n", 1) not in (1, None):
            raise ValueError(f"The slime sim engine supports n=1 only, got n={sp['n']}; send one request per sample.")
        max_new = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        max_new = self.config.max_response_len if max_new is None else int(max_new)
        if max_new < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {max_new}.")
        if rid is not None and str(rid) in self._sched.inflight:
            raise ValueError(f"Duplicate request ID {rid!r}: a request with this rid is already in flight.")
        traj = self.tracker.resolve(ids, sampling_seed=sp.get("sampling_seed"), rid=rid)  # no rid: keyed on input_ids
        rid = uuid.uuid4().hex if rid is None else str(rid)
        remaining = max(0, traj.total - (len(ids) - traj.prompt_len))
        if max_new < remaining:
            num_new, reason = max_new, {"type": "length", "length": max_new}
        else:  # reaching the drawn total ends on EOS (also with 0 new tokens: a resume of a finished trajectory)
            num_new, reason = remaining, {"type": "stop", "matched": self.config.eos_token_id}
        future = asyncio.get_running_loop().create_future()
        req = SimRequest(
            rid, self._next_seq, traj, len(ids), len(ids) - traj.prompt_len, num_new, reason, return_logprob, future
        )
        self._next_seq += 1
        self._sched.add(req)
        return future

    async def generate_output(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any] | None = None,
        rid: str | None = None,
        *,
        return_logprob: bool = True,
    ) -> SimOutput:
        """``submit`` and await; a cancelled caller aborts its request."""
        future = self.submit(input_ids, sampling_params, rid, return_logprob=return_logprob)
        try:
            return await future
        except asyncio.CancelledError:
            self.drop([future])
            raise

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any] | None = None,
        rid: str | None = None,
        *,
        return_logprob: bool = True,
    ) -> GenerateResult:
        """One request, answered as ``EngineClient.generate`` would answer it (an abort is a result)."""
        return (await self.generate_output(input_ids, sampling_params, rid, return_logprob=return_logprob)).to_result()

    def drop(self, futures: Sequence[asyncio.Future]) -> None:
        """Abort the requests behind these futures (e.g. their HTTP client went away)."""
        ids = {id(f) for f in futures}
        self._sched.abort([r for r in self._sched.inflight.values() if id(r.future) in ids], "Aborted")

    # ---- control ---------------------------------------------------------------------------------
    def abort(self, rid: str = "", *, abort_all: bool = False) -> int:
        """SGLang ``/abort_request``: every request, or (only if ``rid`` is exactly in flight) every
        rid starting with ``rid``. Returns how many were aborted; running ones keep their tokens."""
        inflight = self._sched.inflight
        if abort_all:
            hit = list(inflight.values())
        elif rid and rid in inflight:
            hit = [r for r in inflight.values() if r.rid.startswith(rid)]
        else:
            return 0
        self._sched.abort(hit, "Aborted")
        return len(hit)

    def abort_all(self) -> int:
        return self.abort(abort_all=True)

    def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        """Stop stepping at the end of the step in progress; ``abort`` aborts everything first,
        ``retract`` requeues the running requests. Raises ValueError on an unknown mode."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"mode must be 'abort', 'retract' or 'in_place', got {mode!r}")
        if mode == "abort":
            self.abort_all()
        elif mode == "retract":
            self._sched.retract()
        self._sched.paused = True
        self._sched.changed.set()

    def continue_generation(self) -> None:
        self._sched.paused = False
        self._sched.wake.set()

    def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False) -> JsonObject:
        """Set the version at once (tokens of steps not yet begun carry it); SGLang's body back."""
        if abort_all_requests:
            self.abort_all()
        self._sched.set_version(new_version)
        return {"success": True, "message": f"Weight version updated to {new_version}.", "new_version": new_version}

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str | None = None, abort_all_requests: bool = False
    ) -> JsonObject:
        """A simulated load of ``weight_sync_ms`` (0 in instant mode); nothing is read from ``model_path``.

        Unless paused, first waits for every request in flight when it was called (aborting them
        with ``abort_all_requests``); requests arriving meanwhile wait until the load is done.
        Concurrent calls run one at a time. Returns ``{"success", "message", "num_paused_requests"}``.
        """
        sched = self._sched
        async with self._update_lock:
            if abort_all_requests:
                self.abort_all()
            sched.barrier = self._next_seq
            try:
                while not sched.paused and any(r.seq < sched.barrier for r in sched.inflight.values()):
                    sched.changed.clear()
                    await sched.changed.wait()
                num_paused = len(sched.inflight) if sched.paused else 0
                sched.syncing = True
                started = time.monotonic()
                if not self.config.instant and self.config.weight_sync_ms > 0:
                    await asyncio.sleep(self.config.weight_sync_ms / 1000.0 / self.config.time_scale)
                self.model_path = model_path
                if weight_version is not None:
                    sched.set_version(weight_version)
                sched.counters.num_weight_updates += 1
                sched.counters.weight_sync_wall_s += time.monotonic() - started
            finally:
                sched.syncing, sched.barrier = False, None
                sched.wake.set()
        message = "Succeeded to update model weights."
        if weight_version is not None:
            message += f" Weight version updated to {weight_version}."
        return {"success": True, "message": message, "num_paused_requests": num_paused}

    def flush_cache(self) -> bool:
        """SGLang refuses unless idle: True when nothing is running or waiting."""
        return not self._sched.inflight

    def stats(self) -> SimStats:
        return self._sched.counters.snapshot(
            self.config,
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            paused=self.paused,
            weight_version=self.weight_version,
        )

    def reset_stats(self) -> None:
        """Zero every counter and restart the elapsed-time clock."""
        self._sched.counters = SimCounters(started_s=time.monotonic())
