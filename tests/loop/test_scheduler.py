"""Scheduler invariants against a fake engine pool: no group lost or trained twice, token-exact resume."""

from __future__ import annotations

import asyncio

import pytest

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.types import Status
from tests.fixtures.fake_pool import FakePool, expected_tokens

MAX_LEN = 32


async def _reward(sample):
    return float(len(sample.response_ids) % 2)


async def run_steps(
    mode,
    num_steps,
    *,
    target=4,
    over=8,
    n=4,
    overlap=True,
    reward_fn=_reward,
    train_ticks=5,
    max_staleness=100,
    staleness_policy="mask",
    group_filter=None,
):
    buffer = DataBuffer()
    pool = FakePool()
    rows = [PromptRow(index=i, prompt=f"p{i}", label=None) for i in range(10_000)]
    trained = []
    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(
                mode=mode,
                rollout_batch_size=target,
                over_sampling_batch_size=over,
                overlap_train=overlap,
                max_staleness=max_staleness,
                staleness_policy=staleness_policy,
            ),
            RolloutConfig(n_samples_per_prompt=n, rollout_max_response_len=MAX_LEN, reward_timeout_s=0.5),
            source=PromptSource(rows, shuffle=False),
            tokenize=lambda t: [1] + [3 + ord(c) % 50 for c in t],
            decode=lambda ids: "",
            pool=pool,
            buffer=buffer,
            reward_fn=reward_fn,
            task_group=tg,
            group_filter=group_filter,
        )
        version = 0
        for _ in range(num_steps):
            groups = await sched.next_batch(target)
            trained.append((version, groups))
            for _ in range(train_ticks):  # the "train step": generation may go on meanwhile
                await asyncio.sleep(0)
            async with sched.paused("in_place" if mode == "async" else "abort"):
                await pool.update_weights_from_disk("w", weight_version=str(version + 1))
                version += 1
                sched.version.bump(), sched.version.publish()  # the train step and the weight sync
        await sched.shutdown()
    return trained, buffer, sched, pool


def _check_trained(trained, buffer, sched, dropped=frozenset()):
    gids = [g.group_id for _, groups in trained for g in groups]
    assert len(gids) == len(set(gids)), "a group was trained twice"
    left = {g.group_id for g in buffer.ready} | {g.group_id for g in buffer.partial_groups()}
    assert not (left & set(gids))
    assert set(gids) | left | set(dropped) == set(range(sched.next_group_id)), "a started group was lost"
    for version, groups in trained:
        for g in groups:
            assert g.is_finished and g.is_rewarded
            for s in g.samples:
                s.check_aligned()
                assert s.response_ids == expected_tokens(f"g{s.group_id}-s{s.index}", MAX_LEN)
                assert s.versions == sorted(s.versions)
                assert max(s.versions) <= version


async def test_april_keeps_partials_and_resumes_token_exactly():
    trained, buffer, sched, pool = await run_steps("april", 6, overlap=False)
    _check_trained(trained, buffer, sched)
    samples = [s for _, gs in trained for g in gs for s in g.samples]
    assert any(s.num_aborts > 0 for s in samples), "no sample was aborted"
    assert any(s.num_versions_spanned >= 2 for s in samples), "no trained sample spans two versions"
    assert pool.events.count("abort_all") >= 3


async def test_april_with_overlap_trains_every_group_once():
    trained, buffer, sched, _ = await run_steps("april", 6, overlap=True, train_ticks=20)
    _check_trained(trained, buffer, sched)


async def test_sync_mode_starts_exactly_one_batch_and_never_aborts():
    trained, buffer, sched, pool = await run_steps("sync", 3)
    _check_trained(trained, buffer, sched)
    assert sched.next_group_id == 3 * 4
    assert all(s.num_aborts == 0 for _, gs in trained for g in gs for s in g.samples)
    assert all(s.num_versions_spanned == 1 for _, gs in trained for g in gs for s in g.samples)
    assert buffer.num_partial == 0


async def test_groups_finished_after_target_are_kept_for_next_step():
    trained, buffer, sched, _ = await run_steps("april", 4, target=2, over=8, overlap=False)
    _check_trained(trained, buffer, sched)
    # with 8 groups in flight and a target of 2, more than 2 groups finish in some step: the
    # extra ones must be trained later, never dropped
    assert sched.next_group_id > 4 * 2


@pytest.mark.parametrize("kind", ["raises", "hangs", "returns_str"])
async def test_reward_failure_marks_sample_failed_and_run_goes_on(kind):
    async def bad_reward(sample):
        if sample.index == 1:
            if kind == "raises":
                raise ZeroDivisionError("boom")
            if kind == "hangs":
                await asyncio.sleep(3600)
            return "1.0"
        return 1.0

    trained, buffer, sched, _ = await run_steps("april", 2, reward_fn=bad_reward, overlap=False)
    _check_trained(trained, buffer, sched)
    for _, groups in trained:
        for g in groups:
            bad = g.samples[1]
            assert bad.status is Status.FAILED and bad.reward == 0.0
            assert bad.evidence["reward_error"]["type"] in ("ZeroDivisionError", "TimeoutError", "PluginError")
            assert all(s.reward == 1.0 for s in g.samples if s.index != 1)


async def test_async_mode_updates_in_place_and_tags_new_tokens_with_new_version():
    trained, buffer, sched, pool = await run_steps("async", 6, train_ticks=30)
    _check_trained(trained, buffer, sched)
    last_update = max(i for i, e in enumerate(pool.events) if e == "continue")
    assert "abort_all" not in pool.events[:last_update], "async mode must not abort before shutdown"
    assert pool.events[:3] == ["pause:in_place", "update:1", "continue"]
    samples = [s for _, gs in trained for g in gs for s in g.samples]
    assert all(s.num_aborts == 0 for s in samples)
    assert any(s.num_versions_spanned >= 2 for s in samples), "no sample straddled an in-place update"


@pytest.mark.parametrize("mode", ["april", "async"])
async def test_admission_control_bounds_version_lag(mode):
    trained, buffer, sched, _ = await run_steps(
        mode, 8, target=2, over=16, max_staleness=1, train_ticks=40, overlap=True
    )
    _check_trained(trained, buffer, sched)
    for version, groups in trained:
        for g in groups:
            for s in g.samples:
                assert version - min(s.versions) <= 1 or not any(
                    m for v, m in zip(s.versions, s.loss_mask) if version - v > 1
                ), f"token lag {version - min(s.versions)} > 1 admitted"
    assert sched.num_admitted <= (sched.engine_version + 1 + 1) * 2


async def test_staleness_drop_policy_drops_whole_group_and_replaces_it():
    trained, buffer, sched, _ = await run_steps(
        "april", 6, target=2, over=16, max_staleness=0, staleness_policy="drop", train_ticks=40
    )
    dropped = (
        set(range(sched.next_group_id))
        - {g.group_id for _, gs in trained for g in gs}
        - {g.group_id for g in buffer.ready}
        - {g.group_id for g in buffer.partial_groups()}
    )
    _check_trained(trained, buffer, sched, dropped=dropped)
    assert all(len(gs) == 2 for _, gs in trained)
    for version, groups in trained:
        assert all(min(s.versions) >= version for g in groups for s in g.samples)


async def test_dynamic_sampling_filter_replaces_rejected_groups_one_for_one():
    seen = []

    def keep_even(group):
        seen.append(group.group_id)
        return group.group_id % 2 == 0

    trained, buffer, sched, _ = await run_steps("sync", 3, target=4, group_filter=keep_even)
    gids = [g.group_id for _, gs in trained for g in gs]
    assert all(g % 2 == 0 for g in gids) and len(gids) == 12
    # sync mode: exactly one replacement per rejected group, never a wave
    assert sched.next_group_id == len(seen) and len(seen) - len(gids) == sum(1 for g in seen if g % 2)


async def _leaves_pending(sample, sampling_params, **kw):
    return None  # grows nothing and sets no status


async def _future_version(sample, sampling_params, *, engine_version, **kw):
    sample.append([5], [-0.1], engine_version + 7)
    sample.status = Status.COMPLETED
    return sample


async def _too_long(sample, sampling_params, *, max_response_len, engine_version, **kw):
    n = max_response_len + 3
    sample.append([5] * n, [-0.1] * n, engine_version)
    sample.status = Status.COMPLETED
    return sample


@pytest.mark.parametrize(
    "generate, words",
    [
        (_leaves_pending, "status is still pending"),
        (_future_version, "policy version 7, newer than the engine's 0"),
        (_too_long, f"{MAX_LEN + 3} response tokens, more than max_response_len={MAX_LEN}"),
    ],
)
async def test_a_generate_function_that_breaks_the_contract_stops_the_run_with_the_reason(generate, words):
    from slime.errors import PluginError

    rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(8)]
    with pytest.raises(ExceptionGroup) as info:
        async with asyncio.TaskGroup() as tg:
            sched = Scheduler(
                LoopConfig(mode="sync", rollout_batch_size=2, over_sampling_batch_size=2),
                RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=MAX_LEN),
                source=PromptSource(rows, shuffle=False),
                tokenize=lambda t: [1, 2],
                decode=lambda ids: "",
                pool=FakePool(),
                buffer=DataBuffer(),
                reward_fn=_reward,
                task_group=tg,
                generate_fn=generate,
            )
            async with asyncio.timeout(10):  # before the fix, a pending sample looped forever
                await sched.next_batch(2)
    errors = info.value.subgroup(PluginError).exceptions
    assert errors and words in str(errors[0]) and "broke its contract" in str(errors[0])
