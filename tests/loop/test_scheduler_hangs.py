"""The scheduler never waits forever: a dropped stale group is replaced in sync mode, a hung engine
or a generate function that ignores aborts ends the drain with the right culprit named."""

from __future__ import annotations

import asyncio

import pytest

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.loop.version import PolicyVersion
from slime.types import Group, Sample, Status
from tests.fixtures.fake_pool import FakePool


async def _reward(sample):
    return 1.0


def _scheduler(tg, *, pool=None, buffer=None, generate_fn=None, **loop_kw):
    rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(100)]
    kw = {} if generate_fn is None else {"generate_fn": generate_fn}
    return Scheduler(
        LoopConfig(**{"mode": "sync", "rollout_batch_size": 2, "over_sampling_batch_size": 2, **loop_kw}),
        RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=16),
        source=PromptSource(rows, shuffle=False),
        tokenize=lambda t: [1, 2, 3],
        decode=lambda ids: "",
        pool=pool or FakePool(),
        buffer=buffer or DataBuffer(),
        reward_fn=_reward,
        task_group=tg,
        **kw,
    )


def _finished_group(group_id: int, version: int) -> Group:
    samples = []
    for i in range(2):
        s = Sample(prompt_ids=[1, 2, 3], group_id=group_id, index=i)
        s.append([5, 6], [-0.1, -0.1], version, trainable=True)
        s.status, s.reward = Status.COMPLETED, 1.0
        samples.append(s)
    return Group(group_id=group_id, samples=samples)


async def test_sync_mode_replaces_a_dropped_stale_group():
    # a checkpoint of an april/async run resumed in sync mode: its ready groups are older than
    # max_staleness, so the drop policy drops them; each must be replaced by a fresh group
    buffer = DataBuffer()
    buffer.restore(ready=[_finished_group(1000, 0), _finished_group(1001, 0)], partial=[], taken=[])
    async with asyncio.TaskGroup() as tg:
        sched = _scheduler(tg, pool=FakePool(version=5), buffer=buffer, max_staleness=1, staleness_policy="drop")
        sched.version = PolicyVersion(5)  # the version of the engines it starts on
        async with asyncio.timeout(5):  # before the fix: waited forever
            batch = await sched.next_batch(2)
        await sched.shutdown()
    assert len(batch) == 2 and all(g.group_id < 1000 for g in batch)
    assert sched.stats.dropped_stale_groups == 2
    assert sched.next_group_id == 2, "sync mode starts exactly one replacement per dropped group"


async def _start_generating(sched, pool):
    """Open the gate (a batch that never completes here) and wait until requests run."""
    task = asyncio.create_task(sched.next_batch(2))
    async with asyncio.timeout(5):
        while pool.num_inflight < 4:
            await asyncio.sleep(0.01)
    return task


async def test_the_drain_gives_up_on_a_hung_engine_and_the_samples_resume():
    pool = FakePool()
    pool.hung = True  # ignores /abort_request: before the fix, paused() raised after abort_timeout_s
    async with asyncio.TaskGroup() as tg:
        sched = _scheduler(tg, pool=pool, abort_timeout_s=0.2)
        batch = await _start_generating(sched, pool)
        async with asyncio.timeout(5):
            async with sched.paused():
                assert sched._num_requests == 0
        assert pool.events.count("give_up") == 1
        pool.hung = False
        async with asyncio.timeout(5):
            groups = await batch
        await sched.shutdown()
    assert len(groups) == 2 and all(s.num_aborts >= 1 for g in groups for s in g.samples)
    assert all(s.status is Status.COMPLETED for g in groups for s in g.samples)


async def stubborn_generate(sample, sampling_params, *, pool, **kw):
    """A plugin that ignores aborts: it backs off and sends the request again until it is not aborted."""
    from slime.rollout.generate import generate

    while True:
        await generate(sample, sampling_params, pool=pool, **kw)
        if sample.status is not Status.PARTIAL:
            return sample
        await asyncio.sleep(60)


async def test_a_generate_function_that_ignores_aborts_is_named_not_the_engine():
    from slime.errors import PluginError

    pool = FakePool()
    pool.hung = True  # requests run until the drain starts; then the engine honours every abort
    with pytest.raises(ExceptionGroup) as info:
        async with asyncio.TaskGroup() as tg:
            sched = _scheduler(tg, pool=pool, generate_fn=stubborn_generate, abort_timeout_s=0.3)
            batch = await _start_generating(sched, pool)
            pool.hung = False
            try:
                async with asyncio.timeout(5):
                    async with sched.paused():
                        pass
            finally:
                batch.cancel()
    errors = info.value.subgroup(PluginError).exceptions
    assert errors, info.value
    message = str(errors[0])
    assert "test_scheduler_hangs.stubborn_generate" in message and "ignores aborts" in message
    assert "/abort_request" not in message
    assert "give_up" not in pool.events, "a healthy engine was taken out"


async def test_a_failure_elsewhere_cancels_the_groups_without_a_taskgroup_shutting_down_error():
    pool = FakePool()
    with pytest.raises(ExceptionGroup) as info:
        async with asyncio.TaskGroup() as tg:
            sched = _scheduler(
                tg,
                pool=pool,
                mode="april",
                rollout_batch_size=1,
                over_sampling_batch_size=4,
                overlap_train=True,
                max_staleness=100,
            )
            await sched.next_batch(1)  # generation goes on, gate open (overlap), as while the trainer works
            raise ValueError("the train step failed")
    assert [type(e) for e in info.value.exceptions] == [ValueError], info.value.exceptions
