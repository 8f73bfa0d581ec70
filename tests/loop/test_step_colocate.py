"""``run_step(colocate=True)``: pause, release engine memory, train, resume memory, sync, in that order."""

from __future__ import annotations

import asyncio

import pytest

from slime.config import Config, LoopConfig, RolloutConfig, SyncConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.errors import ConfigError
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.train_metrics import TrainMetrics
from tests.fixtures.fake_pool import FakePool


class _ColocatedPool(FakePool):
    async def release_memory_occupation(self, tags=None):
        assert not self._active, f"release with {len(self._active)} requests running"
        self.events.append(f"release@{self.num_generate_calls}")

    async def resume_memory_occupation(self, tags=None):
        self.events.append(f"resume@{self.num_generate_calls}")


class _Sync:
    def __init__(self, pool):
        self.pool = pool

    async def save(self, version):
        self.pool.events.append(f"save:{version}")
        return version

    async def load(self, staged, version, *, abort_all_requests=True):
        assert abort_all_requests
        await self.pool.update_weights_from_disk("w", weight_version=str(version))


async def _reward(sample):
    return 1.0


def _scheduler(pool, tg, *, mode, over_sampling_batch_size):
    return Scheduler(
        LoopConfig(mode=mode, rollout_batch_size=2, over_sampling_batch_size=over_sampling_batch_size, max_staleness=4),
        RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=32, reward_timeout_s=1.0),
        source=PromptSource([PromptRow(index=i, prompt=f"p{i}") for i in range(100)], shuffle=False),
        tokenize=lambda t: [1, 5, 7],
        decode=lambda ids: "",
        pool=pool,
        buffer=DataBuffer(),
        reward_fn=_reward,
        task_group=tg,
    )


@pytest.mark.parametrize("mode", ["sync", "april"])
async def test_colocated_step_releases_memory_around_training_and_syncs_after_resuming(mode):
    pool = _ColocatedPool()
    async with asyncio.TaskGroup() as tg:
        sched = _scheduler(pool, tg, mode=mode, over_sampling_batch_size=4)

        def train_step(groups):
            pool.events.append(f"train@{pool.num_generate_calls}")
            return TrainMetrics()

        version = 0
        for _ in range(2):
            _, record = await run_step(sched, train_step=train_step, sync=_Sync(pool), colocate=True)
            version = sched.version.engines
        await sched.shutdown()
    steps = [
        e for e in pool.events if e.split("@")[0].split(":")[0] in ("release", "train", "save", "resume", "update")
    ]
    assert [e.split("@")[0] for e in steps] == [
        e for v in (1, 2) for e in ("release", "train", f"save:{v}", "resume", f"update:{v}")
    ]
    for i in (0, 5):  # no generate call between releasing memory and loading the new weights
        calls = {int(e.split("@")[1]) for e in steps[i : i + 4] if "@" in e}
        assert len(calls) == 1, steps
    assert version == 2 and record.policy_version == 2


async def test_colocated_step_records_the_device_memory_the_engines_released(monkeypatch):
    """weight_sync/engine_memory_released_gib: free device memory after the release minus before it."""
    import slime.loop.step as step_module

    free = iter([10 * 2**30, 13.5 * 2**30])  # before and after the release
    monkeypatch.setattr(step_module, "device_free_bytes", lambda: int(next(free)))
    pool = _ColocatedPool()
    async with asyncio.TaskGroup() as tg:
        sched = _scheduler(pool, tg, mode="sync", over_sampling_batch_size=2)
        _, record = await run_step(sched, train_step=lambda groups: TrainMetrics(), sync=_Sync(pool), colocate=True)
        _, plain = await run_step(sched, train_step=lambda groups: TrainMetrics(), sync=_Sync(pool), colocate=False)
        await sched.shutdown()
    assert record.weight_sync == {"engine_memory_released_gib": 3.5}
    assert plain.weight_sync == {}  # no release, no reading
    assert step_module._released_gib(None, None) == {}  # no CUDA: nothing recorded


def test_colocate_rejects_delta_sync_and_async_mode():
    with pytest.raises(ConfigError, match="--colocate with --weight-sync"):
        Config(sync=SyncConfig(colocate=True, method="delta")).validate()
    with pytest.raises(ConfigError, match="--colocate with --rollout-mode"):
        Config(sync=SyncConfig(colocate=True), loop=LoopConfig(mode="async")).validate()


async def test_a_step_refuses_a_train_step_without_sync_and_colocate_without_engines_before_taking_groups():
    """Both misuses are caught on entry, so no rollout group is taken (and lost) first."""

    class _NoEngines:  # a scheduler without a pool (as ReplayScheduler); must not be asked for a batch
        pool = None

        async def next_batch(self, n):
            raise AssertionError("took a batch")

    with pytest.raises(ValueError, match="needs a weight sync"):
        await run_step(_NoEngines(), train_step=lambda groups: TrainMetrics(), sync=None)
    with pytest.raises(ValueError, match="no engine pool"):
        await run_step(_NoEngines(), train_step=None, sync=None, colocate=True)
