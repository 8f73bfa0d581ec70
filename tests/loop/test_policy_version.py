"""The policy version has one owner (``slime.loop.version.PolicyVersion``): step after step, the
trainer's version, the engines' version after the weight sync and the versions stamped on the
tokens the next step trains agree, in every mode, through the real ``run_step``."""

from __future__ import annotations

import asyncio

import pytest

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.loop.version import PolicyVersion
from slime.train_metrics import TrainMetrics
from tests.fixtures.fake_pool import FakePool


class _Sync:
    def __init__(self, pool):
        self.pool = pool

    async def save(self, version):
        return "w"

    async def load(self, path, version, *, abort_all_requests=True):
        await self.pool.update_weights_from_disk(
            path, weight_version=str(version), abort_all_requests=abort_all_requests
        )


class _Trainer:
    """Holds its own counter, as the torch and megatron backends do, and reports it as they do."""

    def __init__(self, start):
        self.policy_version = start
        self.seen: list[tuple[int, set[int]]] = []

    def train_step(self, groups):
        self.seen.append((self.policy_version, {v for g in groups for s in g.samples for v in s.versions}))
        self.policy_version += 1
        return TrainMetrics(policy_version=float(self.policy_version))


async def _reward(sample):
    return 1.0


@pytest.mark.parametrize("mode", ["sync", "april", "async"])
@pytest.mark.parametrize("start", [0, 3])
async def test_trainer_engine_and_token_versions_agree_step_after_step(mode, start):
    pool = FakePool(version=start)
    trainer = _Trainer(start)
    version = PolicyVersion(start)
    rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(200)]
    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(
                mode=mode, rollout_batch_size=2, over_sampling_batch_size=4, max_staleness=0 if mode == "sync" else 1
            ),
            RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=16),
            source=PromptSource(rows, shuffle=False),
            tokenize=lambda t: [1, 3 + len(t)],
            decode=lambda ids: "",
            pool=pool,
            buffer=DataBuffer(),
            reward_fn=_reward,
            task_group=tg,
            version=version,
        )
        for step in range(1, 5):
            _, record = await run_step(sched, train_step=trainer.train_step, sync=_Sync(pool))
            assert version.trainer == version.engines == trainer.policy_version == start + step == record.policy_version
            assert pool.version == str(version.engines) and sched.engine_version == version.engines
        await sched.shutdown()
    for step, (trained_at, token_versions) in enumerate(trainer.seen):
        assert trained_at == start + step  # the trainer trains step k at the version the loop counts
        assert max(token_versions) <= trained_at  # no token from the future
        if mode == "sync":
            assert token_versions == {trained_at}  # on-policy: every token of the batch from the trainer's weights


async def test_a_trainer_whose_counter_drifts_stops_the_run():
    pool = FakePool()
    trainer = _Trainer(5)  # e.g. a checkpoint's trainer.pt of another run
    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(mode="sync", rollout_batch_size=1),
            RolloutConfig(n_samples_per_prompt=1, rollout_max_response_len=8),
            source=PromptSource([PromptRow(index=0, prompt="p")], shuffle=False),
            tokenize=lambda t: [1, 2],
            decode=lambda ids: "",
            pool=pool,
            buffer=DataBuffer(),
            reward_fn=_reward,
            task_group=tg,
        )
        with pytest.raises(RuntimeError, match="trainer reports policy version 6 after its step, the loop counts 1"):
            await run_step(sched, train_step=trainer.train_step, sync=_Sync(pool))
        await sched.shutdown()


def test_policy_version_is_read_only_outside_bump_and_publish():
    v = PolicyVersion(2)
    assert (v.bump(), v.trainer, v.engines) == (3, 3, 2)
    v.publish()
    assert v.engines == 3
    with pytest.raises(AttributeError):
        v.engines = 7
