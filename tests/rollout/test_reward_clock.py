"""The reward deadline stands still while a reward waits for a sandbox slot (``slime.rollout.reward_clock``)."""

from __future__ import annotations

import asyncio

import pytest

from slime.rollout.reward_clock import queued
from slime.rollout.rewards import score_sample
from slime.types import Sample, Status


def _sample() -> Sample:
    s = Sample(prompt_ids=[1], status=Status.COMPLETED)
    s.append([2], [0.0], 0)
    return s


async def test_time_queued_is_not_the_rewards_own_and_its_own_time_still_is():
    async def waits_then_works(sample):
        async with queued():
            await asyncio.sleep(0.4)  # others' turn: 2x the deadline
        await asyncio.sleep(0.05)
        return 1.0

    async def works_too_long(sample):
        async with queued():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.4)
        return 1.0

    patient, slow = _sample(), _sample()
    await asyncio.gather(
        score_sample(patient, waits_then_works, timeout_s=0.2), score_sample(slow, works_too_long, timeout_s=0.2)
    )
    assert patient.reward == 1.0 and patient.status is Status.COMPLETED
    assert slow.status is Status.FAILED and "timed out after 0.2s" in slow.evidence["reward_error"]["message"]


async def test_concurrent_waits_of_one_reward_pause_it_once():
    async def two_waits(sample):
        async def one(delay):
            async with queued():
                await asyncio.sleep(delay)

        await asyncio.gather(one(0.3), one(0.45))  # overlapping waits, both past the deadline
        return 0.5

    s = _sample()
    await score_sample(s, two_waits, timeout_s=0.2)
    assert s.reward == 0.5


def test_queued_outside_a_reward_changes_nothing():
    async def main():
        async with queued():
            await asyncio.sleep(0)
        return True

    assert asyncio.run(main())


@pytest.mark.skipif(
    __import__("slime.rollout.tools.sandbox", fromlist=["x"]).sandbox_unavailable_reason() is not None,
    reason="no OS sandbox",
)
async def test_a_sample_queued_behind_a_slow_one_for_the_one_slot_is_still_scored():
    from slime.rollout.tools.sandbox import Sandbox

    box = Sandbox(timeout_s=5.0, max_concurrency=1)

    async def runs_code(sample):
        result = await box.run("import time; time.sleep(1.5); print('done')")
        return 1.0 if result.stdout.strip() == "done" else 0.0

    first, second = _sample(), _sample()
    # the second waits ~1.5 s for the slot, then runs ~1.5 s: 3 s in all, past the 2.5 s deadline, 1.5 s its own
    await asyncio.gather(*(score_sample(s, runs_code, timeout_s=2.5) for s in (first, second)))
    assert (first.reward, second.reward) == (1.0, 1.0), second.evidence
