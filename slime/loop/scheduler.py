"""The rollout scheduler: over-provisioning, abort at target, partial-rollout recycling (APRIL).

::

    PromptSource ──► _fill() ──start group──► _run_group ──► _run_sample ──/generate──► EnginePool
                       ▲  gate open?             │   (one task per group,   │ finish: stop/length
                       │  capacity left?         │    a coroutine a sample) │ abort: PARTIAL (tokens kept)
                       │                         ▼                          ▼
                 partial queue ◄── some PARTIAL ─┴─ all finished ──► reward ──► DataBuffer.ready
                 (served first)                                                  │
                                                          next_batch(n) ◄────────┘ (driver → trainer)

The loops, what they consume and produce, what they wait for and what wakes them:

- ``_fill`` (called on every state change, never blocks): consumes partial groups (first) and
  new prompts; produces group tasks; starts nothing while the gate is closed or while
  ``ready + in-flight`` groups reach the capacity (``over_sampling_batch_size`` in ``april``,
  ``rollout_batch_size`` in ``sync``).
- ``_run_group`` (a task per group): runs its unfinished samples concurrently; when each is
  finished it is rewarded (``slime.rollout.rewards``); the group then goes to ``ready`` (all
  finished) or back to the partial queue (aborted). It waits on the engines and reward
  functions; an abort from ``next_batch`` or ``paused`` makes its requests return early.
- ``next_batch`` (the driver): waits until ``n`` groups are ready. ``sync``: opens the gate for
  exactly the groups the batch still needs and waits for all of them. ``april``: keeps the gate
  open; at the target, with ``overlap_train`` off, it closes the gate and aborts the stragglers,
  which return as partial groups. With ``overlap_train`` on, stragglers keep generating while
  the trainer works and are aborted by the weight update.
- ``paused`` (the weight sync): closes the gate, aborts every request, waits until none is in
  flight (so no request straddles a weight change and every token's version is exact), lets the
  caller update the weights, then restores the gate and refills (partials first).

Not covered here (see issue 3): fully asynchronous mode, admission control by staleness.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any, Awaitable, Callable

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptSource
from slime.loop.buffer import DataBuffer
from slime.rollout.generate import generate as default_generate
from slime.rollout.rewards import score_group, score_sample
from slime.types import Group, Sample, Status

__all__ = ["Scheduler", "StepStats"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StepStats:
    """Counters since the last ``pop_stats()``."""

    started_groups: int = 0
    finished_groups: int = 0
    aborted_samples: int = 0
    resumed_samples: int = 0
    failed_samples: int = 0
    generated_tokens: int = 0


class Scheduler:
    """Owns the groups in flight; fills ``buffer.ready`` with rewarded groups.

    Args:
        config: the loop section (mode, batch sizes, abort timeout).
        rollout: the rollout section (group size, sampling, reward timeout).
        source: prompt rows, handed out in a resumable order.
        tokenize / decode: prompt text -> ids, response ids -> text.
        pool: the ``EnginePool``.
        buffer: where ready and partial groups live.
        reward_fn: per-sample reward, or None when ``group_reward_fn`` is given.
        task_group: owns every group task (a failure in our code cancels the run).
        generate_fn: the generate function (default: one ``/generate`` call per segment).
    """

    def __init__(
        self,
        config: LoopConfig,
        rollout: RolloutConfig,
        *,
        source: PromptSource,
        tokenize: Callable[[str], list[int]],
        decode: Callable[[list[int]], str],
        pool: Any,
        buffer: DataBuffer,
        reward_fn: Callable[[Sample], Awaitable[float]] | None,
        task_group: asyncio.TaskGroup,
        group_reward_fn: Callable[[list[Sample]], Awaitable[list[float]]] | None = None,
        generate_fn: Callable[..., Awaitable[Any]] = default_generate,
        engine_version: int = 0,
        next_group_id: int = 0,
    ):
        if reward_fn is None and group_reward_fn is None:
            raise ValueError("Scheduler needs reward_fn or group_reward_fn")
        self.config = config
        self.rollout = rollout
        self.source = source
        self.tokenize = tokenize
        self.decode = decode
        self.pool = pool
        self.buffer = buffer
        self.reward_fn = reward_fn
        self.group_reward_fn = group_reward_fn
        self.generate_fn = generate_fn
        self.task_group = task_group
        self.engine_version = engine_version
        """The policy version every engine holds (bumped by the driver after a weight sync)."""
        self.rollout_id = 0
        self.next_group_id = next_group_id
        self.inflight: dict[int, Group] = {}
        self.stats = StepStats()
        self._gate_open = False
        self._budget: int | None = None
        self._num_requests = 0
        self._changed = asyncio.Condition()
        self.sampling_params: dict[str, Any] = {
            "temperature": rollout.rollout_temperature,
            "top_p": rollout.rollout_top_p,
            "top_k": rollout.rollout_top_k,
        }
        if rollout.rollout_stop_token_ids:
            self.sampling_params["stop_token_ids"] = list(rollout.rollout_stop_token_ids)

    @property
    def capacity(self) -> int:
        """Groups held at once (in flight + ready): the over-provisioning bound."""
        if self.config.mode == "sync":
            return self.config.rollout_batch_size
        return self.config.over_sampling_batch_size

    # -- group lifecycle ------------------------------------------------------------------------
    def _new_group(self) -> Group:
        row = self.source.next()
        prompt_ids = self.tokenize(row.prompt)
        gid = self.next_group_id
        self.next_group_id += 1
        samples = [
            Sample(prompt_ids=list(prompt_ids), group_id=gid, index=i, label=row.label, prompt=row.prompt, metadata=dict(row.metadata))
            for i in range(self.rollout.n_samples_per_prompt)
        ]
        return Group(group_id=gid, samples=samples, rollout_id=self.rollout_id, data_index=row.index)

    def _fill(self) -> None:
        while self._gate_open and len(self.inflight) + self.buffer.num_ready < self.capacity:
            group = self.buffer.pop_partial()
            if group is None:
                if self._budget is not None:
                    if self._budget <= 0:
                        return
                    self._budget -= 1
                group = self._new_group()
                self.stats.started_groups += 1
            self.inflight[group.group_id] = group
            self.task_group.create_task(self._run_group(group), name=f"group-{group.group_id}")

    async def _run_group(self, group: Group) -> None:
        try:
            await asyncio.gather(*(self._run_sample(s) for s in group.samples if s.reward is None))
            if group.is_finished and self.group_reward_fn is not None and not group.is_rewarded:
                await score_group(group.samples, self.group_reward_fn, timeout_s=self.rollout.reward_timeout_s)
            if group.is_finished and group.is_rewarded:
                self.stats.finished_groups += 1
                self.stats.failed_samples += sum(s.status is Status.FAILED for s in group.samples)
                self.buffer.push_ready(group)
            else:
                self.buffer.push_partial(group)
        finally:
            del self.inflight[group.group_id]
            await self._notify()
            self._fill()

    async def _run_sample(self, sample: Sample) -> None:
        if sample.status.is_resumable:
            if not self._gate_open:
                return  # stays PENDING/PARTIAL; the group is queued as partial
            if sample.num_aborts > 0:
                self.stats.resumed_samples += 1
            before = len(sample.response_ids)
            self._num_requests += 1
            try:
                await self.generate_fn(
                    sample,
                    self.sampling_params,
                    pool=self.pool,
                    max_response_len=self.rollout.rollout_max_response_len,
                    engine_version=self.engine_version,
                    decode=self.decode,
                )
            finally:
                self._num_requests -= 1
                await self._notify()
            sample.check_aligned()
            self.stats.generated_tokens += len(sample.response_ids) - before
            if sample.status is Status.PARTIAL:
                self.stats.aborted_samples += 1
                return
        if sample.status is Status.FAILED:
            sample.reward = 0.0
        elif self.group_reward_fn is None and sample.reward is None:
            await score_sample(sample, self.reward_fn, timeout_s=self.rollout.reward_timeout_s)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait_for(self, predicate: Callable[[], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(predicate)

    # -- driver API -----------------------------------------------------------------------------
    async def next_batch(self, n: int) -> list[Group]:
        """Wait for ``n`` ready groups and take them (oldest first). See the module docstring."""
        self.rollout_id += 1
        if self.config.mode == "sync":
            self._budget = max(0, n - self.buffer.num_ready - len(self.inflight))
        else:
            self._budget = None
        self._gate_open = True
        self._fill()
        await self._wait_for(lambda: self.buffer.num_ready >= n)
        if self.config.mode == "sync" or not self.config.overlap_train:
            self._gate_open = False
            if self.inflight:
                await self.pool.abort_all()
        return self.buffer.take(n)

    @contextlib.asynccontextmanager
    async def paused(self):
        """Stop generation with nothing in flight (for a weight update), then resume it."""
        was_open = self._gate_open
        self._gate_open = False
        await self._drain()
        try:
            yield
        finally:
            self._gate_open = was_open
            self._fill()

    async def _drain(self) -> None:
        """Abort every request and wait until none is in flight (re-aborting each second)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.abort_timeout_s
        while self._num_requests > 0:
            await self.pool.abort_all()
            try:
                async with asyncio.timeout(1.0):
                    await self._wait_for(lambda: self._num_requests == 0)
            except TimeoutError:
                if loop.time() > deadline:
                    raise RuntimeError(
                        f"{self._num_requests} generate requests still in flight {self.config.abort_timeout_s}s "
                        "after abort_all; the engine does not honour /abort_request"
                    ) from None

    async def shutdown(self) -> None:
        """Abort everything and wait for every group task; leftovers stay in the partial queue."""
        self._gate_open = False
        await self._drain()
        await self._wait_for(lambda: not self.inflight)

    def pop_stats(self) -> StepStats:
        stats, self.stats = self.stats, StepStats()
        return stats
