"""Offline groups mixed into batches at an exact ratio, exempt from every staleness rule."""

from __future__ import annotations

import asyncio

import pytest

from slime.config import DataConfig, LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.data.offline import OfflineGroup, OfflineSample, OfflineSource
from slime.loop.buffer import DataBuffer
from slime.loop.inputs import offline_source
from slime.loop.offpolicy import apply_staleness
from slime.loop.scheduler import Scheduler
from slime.train.batch import build_train_batch
from slime.types import OFFLINE_VERSION
from tests.fixtures.fake_pool import FakePool


async def _reward(sample):
    return float(len(sample.response_ids) % 2)


def _offline_source(num_groups=3, n=2):
    groups = [
        OfflineGroup(
            index=i,
            row=PromptRow(index=i, prompt=f"o{i}"),
            prompt_ids=[1, 4, 5],
            samples=[
                OfflineSample(
                    response="r", response_ids=[7, 8, 2], logprobs=[-0.1, -0.2, -0.3], reward=1.0 if j == 0 else None
                )
                for j in range(n)
            ],
        )
        for i in range(num_groups)
    ]
    return OfflineSource(groups)


async def _run(mode, ratio, num_batches, *, target=4, max_staleness=100, staleness_policy="mask"):
    pool = FakePool()
    batches = []
    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(
                mode=mode,
                rollout_batch_size=target,
                over_sampling_batch_size=2 * target,
                offline_ratio=ratio,
                max_staleness=max_staleness,
                staleness_policy=staleness_policy,
            ),
            RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=16),
            source=PromptSource([PromptRow(index=i, prompt=f"p{i}") for i in range(1000)], shuffle=False),
            tokenize=lambda t: [1, 3 + len(t)],
            decode=lambda ids: "",
            pool=pool,
            buffer=DataBuffer(),
            reward_fn=_reward,
            task_group=tg,
            offline=_offline_source(),
        )
        for version in range(num_batches):
            batches.append(await sched.next_batch(target))
            async with sched.paused("in_place" if mode == "async" else "abort"):
                await pool.update_weights_from_disk("w", weight_version=str(version + 1))
                sched.version.bump(), sched.version.publish()  # the train step and the weight sync
        await sched.shutdown()
    return batches, sched


def _is_offline(group):
    return all(v == OFFLINE_VERSION for s in group.samples for v in s.versions)


@pytest.mark.parametrize("mode", ["sync", "april", "async"])
async def test_each_batch_takes_exactly_its_share_of_offline_groups(mode):
    batches, _ = await _run(mode, 0.25, 4)
    assert [sum(map(_is_offline, b)) for b in batches] == [1, 1, 1, 1]
    assert all(len(b) == 4 and _is_offline(b[0]) for b in batches), "offline groups are taken first"
    gids = [g.group_id for b in batches for g in b]
    assert len(gids) == len(set(gids))
    offline = [g for b in batches for g in b if _is_offline(g)]
    assert [g.data_index for g in offline] == [0, 1, 2, 0], "the offline source cycles epoch after epoch"
    assert all(s.reward is not None for g in offline for s in g.samples), "rows without a reward are scored"


async def test_a_fractional_share_is_exact_over_batches():
    batches, sched = await _run("april", 0.3, 5)
    assert [sum(map(_is_offline, b)) for b in batches] == [1, 1, 1, 1, 2]  # floor(k * 4 * 0.3) after k batches
    assert sched.config.online_groups_per_batch == 2


async def test_offline_groups_pass_the_staleness_drop_mask_and_trainer_check():
    batches, _ = await _run("april", 0.5, 4, target=2, max_staleness=0, staleness_policy="drop")
    assert [sum(map(_is_offline, b)) for b in batches] == [1, 1, 1, 1]
    groups = [g for b in batches for g in b if _is_offline(g)]
    stats = apply_staleness(groups, trainer_version=7, max_staleness=0)
    assert stats["masked_stale_tokens"] == 0 and stats["offline_tokens"] == 3 * 2 * 4 and stats["lag_histogram"] == {}
    batch = build_train_batch(groups, pad_token_id=0, current_version=7, max_staleness=0)
    assert batch.loss_mask.sum() == 3 * 2 * 4 and int(batch.staleness.max()) == 0


def test_an_offline_source_without_offline_data_is_refused():
    with pytest.raises(ValueError, match="needs --offline-data"):
        offline_source(DataConfig(), LoopConfig(), None, None, n_samples_per_prompt=2, megatron=False, seed=0)
