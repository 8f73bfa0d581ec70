"""The rollout scheduler: one scheduler, three modes (``sync``, ``april``, ``async``).

::

    PromptSource ──► _fill() ──start group──► _run_group ──► _run_sample ──/generate──► EnginePool
                       ▲  gate open? capacity?   │   (a task per group,     │ finish: stop/length
                       │  staleness admission?   │    a coroutine a sample) │ abort: PARTIAL (tokens kept)
                       │                         ▼                          ▼
                 partial queue ◄── some PARTIAL ─┴─ all finished ──► reward ──► filter ──► DataBuffer.ready
                 (served first)                                                              │
                                                             next_batch(n) ◄─────────────────┘ (driver → trainer)

The loops, what they consume and produce, what they wait for and what wakes them:

- ``_fill`` (called on every state change, never blocks): consumes partial groups (first) and
  new prompts; produces group tasks. Starts nothing while the gate is closed, while the groups
  in flight reach the capacity (``over_sampling_batch_size``; in ``sync`` ``rollout_batch_size``;
  ready groups waiting for the trainer do not count, so a slow trainer does not idle the engines:
  what bounds how far generation runs ahead is admission control), or, in ``april``/``async``, when admission control says a new group
  could only be trained more than ``max_staleness`` versions after its first token.
- ``_run_group`` (a task per group): runs its unfinished samples concurrently; each finished
  sample is rewarded (``slime.rollout.rewards``); then the group goes to ``ready`` (after the
  dynamic-sampling filter; a rejected group frees its slot, so exactly one new group replaces it)
  or back to the partial queue (some sample aborted). It waits on engines and reward functions.
- ``next_batch`` (the driver): waits until ``n`` groups are ready and takes them. ``sync`` opens
  the gate for exactly the groups the batch still needs (one more for each group filtered out or
  dropped as stale, e.g. ready groups of a checkpoint from another mode). ``april`` keeps ``over_sampling`` groups
  in flight; at the target it aborts the stragglers, which come back as partial groups; with
  ``overlap_train`` the gate then reopens at once, so generation goes on while the trainer works
  (partials resume first, on the old weights, and are aborted again by the weight update if still
  running). ``async`` never closes the gate and never aborts.
- ``paused(mode)`` (weight sync): ``"abort"`` closes the gate, aborts every request and waits until
  none is in flight (no request straddles the update, so every token's version is exact), then
  reopens and resumes partials first. Requests an engine still runs ``abort_timeout_s`` later are
  given up on (``EnginePool.give_up_inflight``: the hung engine leaves rotation, the requests end as
  aborts); generate calls that still do not return then are a generate plugin ignoring aborts. ``"in_place"`` (``async``) pauses the engines with requests
  kept; they continue on the new weights and SGLang's ``weight_versions`` spans tag their new tokens.
- Offline data (``--offline-data``, ``--offline-ratio R``): each batch takes its exact share of
  pre-generated groups first (``slime.loop.offline_mix``).
- Buffer bounds: a partial group evicted by ``--buffer-capacity`` or expired by ``max_staleness``
  (``DataBuffer``) frees its admission slot, like a dropped stale group, and is counted per step.

Admission control (AReaL's bound, arXiv 2505.24298): with batches of B groups consumed in order,
the k-th admitted group (0-based) is trained at trainer version >= floor(k / B); started at engine
version v, its lag is at most eta iff k < (v + eta + 1) * B. Example: B=4, eta=1, v=0 -> groups
0..7 may start; the 9th waits for version 1. The consumption-side check (``offpolicy.py``)
enforces the bound exactly, since groups finish out of order. With offline data B is the fewest
online groups a batch takes (``LoopConfig.online_groups_per_batch``). With ``fixed_weights`` (the
rollout-only mode: the version never moves) there is no bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Literal

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptSource
from slime.data.offline import OfflineSource
from slime.engines.interface import EnginePool
from slime.errors import PluginError
from slime.loop.buffer import DataBuffer
from slime.loop.counters import SchedulerCounters
from slime.loop.drain import drain
from slime.loop.generate_contract import check_generate_output
from slime.loop.offline_mix import OfflineMix
from slime.loop.prompts import new_group, sampling_params
from slime.loop.scoring import Scorer
from slime.loop.version import PolicyVersion
from slime.obs.trace import NULL_TRACER, RunTracer
from slime.rollout.generate import generate as default_generate
from slime.rollout.opd import TeacherScorer
from slime.types import OFFLINE_VERSION, GenerateFn, Group, GroupRewardFn, RewardFn, Sample, Status

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


class Scheduler(SchedulerCounters):
    """Owns the groups in flight; fills ``buffer.ready`` with rewarded groups.

    Args:
        config / rollout: the loop and rollout sections.
        source: prompt rows, handed out in a resumable order.
        tokenize / decode: prompt text -> ids, response ids -> text.
        pool: the ``EnginePool`` (or anything with its ``generate``/``abort_all``/pause methods).
        buffer: where ready and partial groups live.
        reward_fn / group_reward_fn: per-sample or per-group reward (one of them).
        task_group: owns every group task (a failure in our code cancels the run).
        generate_fn: the generate function; returns the sample or a list of samples.
        group_filter: dynamic-sampling filter ``(group) -> keep``.
        tracer: ``slime.obs.trace.Tracer``; records each generate request and reward call.
        offline: source of pre-generated groups (``slime.data.offline.OfflineSource``), mixed in at
            ``config.offline_ratio``; None = online only.
        version: the run's ``PolicyVersion`` (read only here: ``engine_version`` is ``version.engines``);
            None = a fresh one at 0.
        fixed_weights: the engines' version never moves (rollout-only mode): no admission bound.
        teacher: on-policy distillation (``--use-opd``): a ``slime.rollout.opd.TeacherScorer`` that
            scores every finished sample (online and offline) before its reward; a teacher failure
            marks the sample FAILED. None = no teacher.
    """

    def __init__(
        self,
        config: LoopConfig,
        rollout: RolloutConfig,
        *,
        source: PromptSource,
        tokenize: Callable[[str], list[int]],
        decode: Callable[[list[int]], str],
        pool: EnginePool,
        buffer: DataBuffer,
        reward_fn: RewardFn | None,
        task_group: asyncio.TaskGroup,
        group_reward_fn: GroupRewardFn | None = None,
        generate_fn: GenerateFn = default_generate,
        group_filter: Callable[[Group], bool] | None = None,
        version: PolicyVersion | None = None,
        next_group_id: int = 0,
        tracer: RunTracer | None = None,
        offline: OfflineSource | None = None,
        fixed_weights: bool = False,
        teacher: TeacherScorer | None = None,
    ):
        if reward_fn is None and group_reward_fn is None:
            raise ValueError("Scheduler needs reward_fn or group_reward_fn")
        super().__init__(version, next_group_id)
        self.config, self.rollout = config, rollout
        self.source, self.tokenize, self.decode = source, tokenize, decode
        self.pool, self.buffer, self.task_group = pool, buffer, task_group
        self.group_reward_fn = group_reward_fn
        self.generate_fn, self.group_filter = generate_fn, group_filter
        self.tracer = tracer or NULL_TRACER
        self.offline, self.fixed_weights = offline, fixed_weights
        self.score = Scorer(
            rollout, reward_fn=reward_fn, group_reward_fn=group_reward_fn, teacher=teacher, tracer=self.tracer
        )
        self.offline_mix = OfflineMix(offline, config.offline_ratio, self.score, self._take_group_id)
        self.inflight: dict[int, Group] = {}
        self._gate_open, self._num_requests = False, 0
        self._budget: int | None = None
        self._changed = asyncio.Condition()
        self.sampling_params: dict[str, Any] = sampling_params(rollout)

    def _take_group_id(self) -> int:
        group_id, self.next_group_id = self.next_group_id, self.next_group_id + 1
        return group_id

    @property
    def capacity(self) -> int:
        """Groups in flight at once (ready groups not counted): the over-provisioning bound."""
        return self.config.rollout_batch_size if self.config.mode == "sync" else self.config.over_sampling_batch_size

    @property
    def admission_limit(self) -> int:
        """Groups that may have been admitted at the current engine version (see module doc)."""
        if self.config.mode == "sync" or self.fixed_weights:
            return 1 << 62  # no bound: sync starts exactly the groups a batch needs; fixed weights never go stale
        # the module doc's bound: the k-th admitted group may start at version v iff k < (v + eta + 1) * B
        return (self.engine_version + self.config.max_staleness + 1) * self.config.online_groups_per_batch

    # -- group lifecycle ------------------------------------------------------------------------
    def _new_group(self) -> Group:
        row, gid = self.source.next(), self.next_group_id
        group = new_group(
            row, self.tokenize, group_id=gid, num_samples=self.rollout.n_samples_per_prompt, rollout_id=self.rollout_id
        )
        self.next_group_id += 1  # only once the row made a group: a row that fails to tokenize takes no id
        return group

    def _fill(self) -> None:
        # expired partials free their admission slots before the checks below count them
        self._lost(self.buffer.expire(self.engine_version), "expired_groups")
        while self._gate_open and len(self.inflight) < self.capacity:
            # partials first: admitted already, they skip the budget and admission checks
            group = self.buffer.pop_partial(self.rollout_id)
            if group is None:
                if self._budget is not None and self._budget <= 0:
                    return
                # admission control: a group started now could be trained more than max_staleness versions late
                if self.num_admitted >= self.admission_limit:
                    return
                if self._budget is not None:
                    self._budget -= 1
                self.num_admitted += 1
                group = self._new_group()
                self.stats.started_groups += 1
            self.inflight[group.group_id] = group
            self.task_group.create_task(self._run_group(group), name=f"group-{group.group_id}")

    async def _run_group(self, group: Group) -> None:
        try:
            # a resumed group: samples already rewarded are not generated again
            results = await asyncio.gather(*(self._run_sample(s) for s in group.samples if s.reward is None))
            for old, new in results:
                if new is not None:  # a generate function that returned several samples
                    i = next(i for i, s in enumerate(group.samples) if s is old)
                    group.samples[i : i + 1] = new
            if group.is_finished:
                await self.score.group(group)
            # some sample aborted: the whole group waits for its resume, its tokens kept
            if not (group.is_finished and group.is_rewarded):
                # pushing may evict older partials (--buffer-capacity): each frees its admission slot
                self._lost(self.buffer.push_partial(group), "evicted_groups")
            elif self.group_filter is not None and not self._keep(self.group_filter, group):
                self.stats.filtered_groups += 1
                self.stats.filtered_tokens += group.num_response_tokens
                self._free_slot()  # a filtered group left the batch: exactly one new group replaces it
            else:
                self.stats.finished_groups += 1
                self.stats.failed_samples += sum(s.status is Status.FAILED for s in group.samples)
                self._lost(self.buffer.push_ready(group), "evicted_groups")
        finally:
            del self.inflight[group.group_id]
            await self._notify()
            task = asyncio.current_task()
            assert task is not None  # this coroutine runs as a task of self.task_group
            if not task.cancelling():  # the task group is shutting down: start nothing
                self._fill()

    def _free_slot(self) -> None:
        """A group counted toward the batch left it (filtered out or dropped as stale): its admission
        slot goes to a new group, and in ``sync`` (which starts exactly the groups the batch needs)
        one more group may start."""
        self.num_admitted -= 1
        if self._budget is not None:
            self._budget += 1

    def _lost(self, groups: list[Group], counter: str) -> None:
        """Partial groups the buffer evicted or expired: each frees its admission slot."""
        self.num_admitted -= len(groups)
        setattr(self.stats, counter, getattr(self.stats, counter) + len(groups))

    def _keep(self, group_filter: Callable[[Group], bool], group: Group) -> bool:
        keep = group_filter(group)
        if not isinstance(keep, bool):
            raise PluginError(
                f"--dynamic-sampling-filter-path returned {type(keep).__name__} {keep!r} for group {group.group_id}, expected bool"
            )
        return keep

    async def _run_sample(self, sample: Sample) -> tuple[Sample, list[Sample] | None]:
        produced: list[Sample] | None = None
        if sample.status.is_resumable:
            if not self._gate_open:
                return sample, None  # stays PENDING/PARTIAL; the group is queued as partial
            if sample.num_aborts > 0:
                self.stats.resumed_samples += 1
            before = len(sample.response_ids)
            self._num_requests += 1
            span = self.tracer.begin("generate", "rollout")
            self.tracer.counter("requests_in_flight", requests=self._num_requests)
            try:
                out = await self.generate_fn(
                    sample,
                    self.sampling_params,
                    pool=self.pool,
                    max_response_len=self.rollout.response_cap(len(sample.prompt_ids)),
                    # read when the request is sent: the fallback stamp of its new tokens (token_versions)
                    engine_version=self.engine_version,
                    decode=self.decode,
                )
            finally:
                self._num_requests -= 1
                if span is not None:
                    self.tracer.end(
                        span,
                        group_id=sample.group_id,
                        index=sample.index,
                        new_tokens=len(sample.response_ids) - before,
                        tokens=len(sample.response_ids),
                        finish=sample.status.value,
                        version=sample.versions[-1] if len(sample.versions) > before else self.engine_version,
                        resumed=before > 0,
                    )
                    self.tracer.counter("requests_in_flight", requests=self._num_requests)
                await self._notify()  # wakes _drain's wait on _num_requests
            produced = check_generate_output(
                sample,
                out,
                max_response_len=self.rollout.response_cap(len(sample.prompt_ids)),
                engine_version=self.engine_version,
            )
            # only this request's tokens: a resumed sample's earlier ones were counted when generated
            self.stats.generated_tokens += sum(len(s.response_ids) for s in produced or [sample]) - before
            if sample.status is Status.PARTIAL:
                # not rewarded: it resumes later from its kept tokens, so _run_group queues the group as partial
                self.stats.aborted_samples += 1
                return sample, None
        for s in produced or [sample]:
            await self.score.sample(s)
        return sample, produced

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
        num_offline = self.offline_mix.quota(self.rollout_id, n)
        n_online = n - num_offline
        self._budget = (
            # sync starts exactly the groups still missing, counting the ready and in-flight ones
            max(0, n_online - self.buffer.num_ready - len(self.inflight)) if self.config.mode == "sync" else None
        )
        if self.config.mode == "async" or self.buffer.num_ready < n_online:  # else the batch is already there
            self._gate_open = True
            self._fill()
        offline_groups = await self.offline_mix.groups(num_offline, rollout_id=self.rollout_id, stats=self.stats)
        for group in reversed(offline_groups):  # taken first, with exactly n_online online groups
            self._lost(self.buffer.push_ready(group, front=True), "evicted_groups")
        batch: list[Group] = []
        while len(batch) < n:
            need = n - len(batch)
            await self._wait_for(lambda: self.buffer.num_ready >= need)  # noqa: B023  # awaited within this iteration
            for group in self.buffer.take(need):
                if self.config.staleness_policy == "drop" and self._too_stale(group):
                    self.stats.dropped_stale_groups += 1
                    self._free_slot()
                    self._gate_open = True  # reopen even in sync/april: the replacement is generated for this batch
                    self._fill()
                else:
                    batch.append(group)
        if self.config.mode in ("sync", "april"):
            self._gate_open = False
            if self._num_requests:
                await self.pool.abort_all()  # stragglers come back as partial groups
            if self.config.mode == "april" and self.config.overlap_train:
                self._gate_open = True  # keep generating while it trains, partials first
        self._fill()
        return batch

    def _too_stale(self, group: Group) -> bool:
        """True if a trainable token of a sample that counts (not FAILED) is more than ``max_staleness`` versions behind the engines
        (which hold the trainer's version whenever a batch is taken). Offline tokens are exempt."""
        bound = self.engine_version - self.config.max_staleness
        return any(
            v < bound and m and v != OFFLINE_VERSION
            for s in group.valid_samples
            for v, m in zip(s.versions, s.loss_mask)
        )

    @contextlib.asynccontextmanager
    async def paused(self, mode: Literal["abort", "in_place"] = "abort"):
        """Hold generation for a weight update. ``abort``: nothing in flight, partials resume after.
        ``in_place``: engines pause with requests kept and continue on the new weights."""
        if mode == "in_place":
            await self.pool.pause_generation("in_place")
            try:
                yield
            finally:
                await self.pool.continue_generation()
                self._fill()
            return
        was_open = self._gate_open  # restore, not open: in sync/april the gate stays closed between batches
        self._gate_open = False
        await self._drain()  # abort and wait: no request straddles the update, so every token's version is exact
        try:
            yield
        finally:
            self._gate_open = was_open
            self._fill()

    async def _drain(self) -> None:
        """Abort every request and wait until none is in flight (``slime.loop.drain.drain``)."""
        await drain(
            self.pool,
            num_requests=lambda: self._num_requests,
            wait_for=self._wait_for,
            abort_timeout_s=self.config.abort_timeout_s,
            generate_fn=self.generate_fn,
        )

    async def shutdown(self) -> None:
        """Abort everything and wait for every group task; leftovers stay in the partial queue."""
        self._gate_open = False
        await self._drain()
        # every group task has pushed its state to the buffer before shutdown returns
        await self._wait_for(lambda: not self.inflight)

    @contextlib.asynccontextmanager
    async def quiesced(self):
        """Nothing in flight and every group in the buffer (for a checkpoint), then resume."""
        was_open = self._gate_open
        await self.shutdown()
        try:
            yield
        finally:
            self._gate_open = was_open
            self._fill()
