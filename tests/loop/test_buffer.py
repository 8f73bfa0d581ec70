"""DataBuffer bounds: capacity evicts the oldest partial groups, staleness expires them; both are counted."""

from __future__ import annotations

import asyncio

import msgspec

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.loop.buffer import DataBuffer
from slime.loop.checkpoint import LoopState
from slime.loop.scheduler import Scheduler
from slime.types import Group, Sample, Status
from tests.fixtures.fake_pool import FakePool


def _group(gid: int, version: int | None, *, finished: bool = False) -> Group:
    s = Sample(prompt_ids=[1], group_id=gid)
    if version is not None:
        s.append([5, 6], [-0.1, -0.2], version)
    s.status = Status.COMPLETED if finished else Status.PARTIAL
    return Group(group_id=gid, samples=[s])


def test_capacity_evicts_the_oldest_partial_groups_and_never_a_ready_one():
    buf = DataBuffer(capacity=3)
    assert buf.push_partial(_group(0, 4)) == [] and buf.push_partial(_group(1, 2)) == []
    assert buf.push_ready(_group(2, 5, finished=True)) == []
    evicted = buf.push_ready(_group(3, 5, finished=True))
    assert [g.group_id for g in evicted] == [1] and buf.num_evicted == 1
    assert [g.group_id for g in buf.push_ready(_group(4, 5, finished=True))] == [0]
    assert buf.push_ready(_group(5, 5, finished=True)) == [] and buf.num_ready == 4, "ready groups are never evicted"
    assert buf.num_partial == 0 and buf.num_evicted == 2


def test_partial_groups_older_than_max_staleness_expire_and_are_counted():
    buf = DataBuffer(max_staleness=2)
    for gid, v in [(0, 3), (1, 5), (2, 4), (3, None)]:
        buf.push_partial(_group(gid, v))
    assert [g.group_id for g in buf.expire(6)] == [0], "6 - 3 > 2; 6 - 4 is not"
    assert buf.num_expired == 1 and [g.group_id for g in buf.partial_groups()] == [2, 1, 3]
    assert [g.group_id for g in buf.expire(8)] == [2, 1] and buf.num_expired == 3
    assert [g.group_id for g in buf.partial_groups()] == [3], "a group with no tokens yet never expires"
    assert DataBuffer().expire(10**6) == []


def test_eviction_and_expiry_counts_survive_a_checkpoint():
    buf = DataBuffer(capacity=1, max_staleness=0)
    buf.push_partial(_group(0, 0))
    buf.push_partial(_group(1, 1))
    buf.expire(2)
    state = LoopState(
        step=1,
        policy_version=2,
        source={"epoch": 0, "position": 2},
        next_group_id=2,
        num_admitted=2,
        rollout_id=1,
        taken=[],
        ready=list(buf.ready),
        partial=buf.partial_groups(),
        num_evicted=buf.num_evicted,
        num_expired=buf.num_expired,
    )
    back = msgspec.json.decode(msgspec.json.encode(state), type=LoopState)
    restored = DataBuffer()
    restored.restore(
        ready=back.ready,
        partial=back.partial,
        taken=back.taken,
        num_evicted=back.num_evicted,
        num_expired=back.num_expired,
    )
    assert (restored.num_evicted, restored.num_expired) == (1, 1)


async def _reward(sample):
    return 1.0


async def test_scheduler_counts_evicted_groups_frees_their_slots_and_loses_nothing_else():
    buffer = DataBuffer(capacity=3)
    pool = FakePool()
    rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(1000)]
    trained, evicted = [], 0
    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(mode="april", rollout_batch_size=2, over_sampling_batch_size=8, max_staleness=100),
            RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=32),
            source=PromptSource(rows, shuffle=False),
            tokenize=lambda t: [1, 3 + len(t)],
            decode=lambda ids: "",
            pool=pool,
            buffer=buffer,
            reward_fn=_reward,
            task_group=tg,
        )
        for version in range(4):
            trained += [g.group_id for g in await sched.next_batch(2)]
            async with sched.paused():
                await pool.update_weights_from_disk("w", weight_version=str(version + 1))
                sched.version.bump(), sched.version.publish()  # the train step and the weight sync
            evicted += sched.pop_stats().evicted_groups
        await sched.shutdown()
        evicted += sched.pop_stats().evicted_groups
    assert evicted == buffer.num_evicted > 0
    assert len(trained) == len(set(trained)) == 8
    left = {g.group_id for g in buffer.ready} | {g.group_id for g in buffer.partial_groups()}
    assert len(set(range(sched.next_group_id)) - set(trained) - left) == buffer.num_evicted
    assert buffer.num_ready + buffer.num_partial <= 3 or buffer.num_partial == 0


def test_take_hands_out_the_groups_with_the_oldest_tokens_first_and_is_fifo_within_a_version():
    from slime.types import OFFLINE_VERSION

    buf = DataBuffer()
    for gid, version in [(0, 3), (1, 1), (2, 3), (3, 2), (4, None), (5, 1)]:
        g = _group(gid, version, finished=True)
        g.rollout_id = 2
        buf.push_ready(g)
    buf.push_ready(_group(6, OFFLINE_VERSION, finished=True), front=True)
    # offline first, then version 1 (arrival order 1, 5), then 2 (group 3 and the token-less group 4,
    # which counts from its rollout_id 2, in arrival order), then 3.
    assert [g.group_id for g in buf.take(4)] == [6, 1, 5, 3]
    assert [g.group_id for g in buf.ready] == [0, 2, 4]
    assert [g.group_id for g in buf.take(3)] == [4, 0, 2]
