"""The scheduler never waits forever: a dropped stale group is replaced in sync mode, a hung engine
or a generate function that ignores aborts ends the drain with the right culprit named."""

from __future__ import annotations

import asyncio

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
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
        source=PromptSource(rows, shuffle=False), tokenize=lambda t: [1, 2, 3], decode=lambda ids: "",
        pool=pool or FakePool(), buffer=buffer or DataBuffer(), reward_fn=_reward, task_group=tg, **kw,
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
        sched.engine_version = 5
        async with asyncio.timeout(5):  # before the fix: waited forever
            batch = await sched.next_batch(2)
        await sched.shutdown()
    assert len(batch) == 2 and all(g.group_id < 1000 for g in batch)
    assert sched.stats.dropped_stale_groups == 2
    assert sched.next_group_id == 2, "sync mode starts exactly one replacement per dropped group"
