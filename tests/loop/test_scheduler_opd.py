"""The scheduler with a teacher (--use-opd): every finished sample is scored exactly once, after its last
segment, so resumed partial rollouts get teacher logprobs aligned with all of their tokens."""

from __future__ import annotations

import asyncio

import pytest

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.loop.step import batch_stats
from slime.rollout.opd import TeacherScorer
from slime.types import Group, Sample, Status
from tests.fixtures.fake_pool import FakePool, expected_tokens
from tests.rollout.test_opd import FakeTeacherPool, teacher_lp

MAX_LEN = 32


async def _reward(sample):
    return float(len(sample.response_ids) % 2)


@pytest.mark.parametrize("mode", ["sync", "april", "async"])
async def test_every_trained_sample_is_scored_once_on_its_final_tokens(mode):
    teacher_pool = FakeTeacherPool()
    pool, trained = FakePool(), []
    rows = [PromptRow(index=i, prompt=f"p{i}", label=None) for i in range(1000)]
    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(
                mode=mode, rollout_batch_size=4, over_sampling_batch_size=8, overlap_train=True, max_staleness=100
            ),
            RolloutConfig(n_samples_per_prompt=4, rollout_max_response_len=MAX_LEN),
            source=PromptSource(rows, shuffle=False),
            tokenize=lambda t: [1] + [3 + ord(c) % 50 for c in t],
            decode=lambda ids: "",
            pool=pool,
            buffer=DataBuffer(),
            reward_fn=_reward,
            task_group=tg,
            teacher=TeacherScorer(teacher_pool),
        )
        for version in range(4):
            trained += await sched.next_batch(4)
            async with sched.paused("in_place" if mode == "async" else "abort"):
                await pool.update_weights_from_disk("w", weight_version=str(version + 1))
                sched.version.bump(), sched.version.publish()  # the train step and the weight sync
        await sched.shutdown()
    samples = [s for g in trained for s in g.samples]
    scored = {tuple(c["input_ids"]) for c in teacher_pool.calls}
    assert len(teacher_pool.calls) == len(scored), "a sample was scored twice"
    if mode == "april":
        assert any(s.num_resumes for s in samples), "no resumed sample: the test would not test resumes"
    for s in samples:
        assert s.status is not Status.FAILED and s.response_ids == expected_tokens(f"g{s.group_id}-s{s.index}", MAX_LEN)
        full = s.prompt_ids + s.response_ids
        assert tuple(full) in scored
        assert s.teacher_logprobs == [
            teacher_lp(full[: len(s.prompt_ids) + i], t) for i, t in enumerate(s.response_ids)
        ]


def test_batch_stats_report_the_rollout_side_reverse_kl_over_trained_tokens():
    a = Sample(prompt_ids=[1], status=Status.COMPLETED, reward=1.0)
    a.append([5, 6], [-0.1, -2.0], policy_version=0)
    a.append([7], [0.0], policy_version=0, trainable=False)  # a tool token: no signal
    a.set_teacher_logprobs([-0.3, -0.5, -9.0])
    b = Sample(prompt_ids=[1], status=Status.FAILED, reward=0.0)  # failed: left out
    b.append([5], [-4.0], policy_version=0)
    b.set_teacher_logprobs([-0.1])
    stats = batch_stats([Group(group_id=0, samples=[a, b])])
    # kl: (-0.1 + 0.3) and (-2.0 + 0.5) -> mean (0.2 - 1.5) / 2 = -0.65; teacher mean (-0.3 - 0.5) / 2
    assert stats["opd/reverse_kl"] == pytest.approx(-0.65) and stats["opd/teacher_logprob_mean"] == pytest.approx(-0.4)
    assert "opd/reverse_kl" not in batch_stats([Group(group_id=1, samples=[Sample(prompt_ids=[1], reward=0.0)])])
