"""FAILED samples (a reward, generate or tool plugin broke) count nowhere: not in GRPO's group statistics,
not in the dynamic-sampling filter, not in any metric. One definition: ``Sample.is_valid``."""

from __future__ import annotations

import dataclasses
import math
import random
import types

import pytest

from slime.data.dataset import PromptRow
from slime.loop.evaluate import evaluate
from slime.loop.filters import nonzero_reward_std
from slime.loop.offpolicy import apply_staleness
from slime.loop.scheduler import Scheduler
from slime.loop.step import batch_stats
from slime.train.batch import build_train_batch, rl_batch_metrics
from slime.types import Group, Sample, Status
from tests.fixtures.fake_pool import FakePool


def _sample(reward: float, *, failed: bool = False, num_tokens: int = 3, version: int = 0, index: int = 0) -> Sample:
    s = Sample(prompt_ids=[1, 2], index=index)
    s.append([3 + i for i in range(num_tokens)], [-0.5] * num_tokens, policy_version=version)
    s.status, s.reward = (
        (Status.FAILED, 0.0) if failed else (Status.COMPLETED, reward)
    )  # 0.0: the reward boundary's placeholder
    return s


def _group(rewards: list[float | None], group_id: int = 0, **kw) -> Group:
    """``None`` = a FAILED sample."""
    return Group(
        group_id=group_id, samples=[_sample(r or 0.0, failed=r is None, index=i, **kw) for i, r in enumerate(rewards)]
    )


def _grpo_moves(group: Group) -> bool:
    """Whether GRPO gives any sample of ``group`` a non-zero advantage."""
    batch = build_train_batch([group], pad_token_id=0, current_version=0)
    return bool((batch.sample_advantages != 0).any())


def test_a_group_whose_counted_rewards_are_equal_is_filtered_out():
    assert nonzero_reward_std(_group([1.0, 1.0, 1.0, None])) is False  # the FAILED placeholder 0.0 is not a reward
    assert nonzero_reward_std(_group([0.0, None, None, None])) is False  # one counted sample: no spread
    assert nonzero_reward_std(_group([1.0, 0.0, None, None])) is True


def test_the_filter_keeps_a_group_exactly_when_grpo_gives_it_an_advantage():
    rng = random.Random(0)
    for gid in range(300):
        rewards = [rng.choice([0.0, 0.5, 1.0, None]) for _ in range(rng.randint(1, 5))]
        group = _group(rewards, group_id=gid)
        assert nonzero_reward_std(group) == _grpo_moves(group), rewards


def test_batch_metrics_leave_failed_samples_out():
    # two counted samples (rewards 1 and 0, 3 tokens each) and one FAILED with 3 tokens of loss mask 1
    stats = batch_stats([_group([1.0, 0.0, None])])
    assert stats["trained_tokens"] == 6 and stats["reward_mean"] == 0.5 and stats["accuracy"] == 0.5
    assert stats["response_len_mean"] == 3 and stats["response_tokens"] == 6
    assert stats["num_samples"] == 3 and stats["failed_samples_in_batch"] == 1


def test_a_batch_of_failed_samples_has_no_reward_to_report():
    stats = batch_stats([_group([None, None])])
    assert stats["trained_tokens"] == 0 and stats["reward_mean"] == 0.0 and stats["failed_samples_in_batch"] == 2


def test_lag_statistics_leave_failed_samples_out():
    group = Group(
        group_id=0, samples=[_sample(1.0, version=3), _sample(0.0, version=1, index=1, failed=True, num_tokens=5)]
    )
    stale = apply_staleness([group], trainer_version=3, max_staleness=1)
    assert (
        stale["lag_histogram"] == {0: 3} and stale["off_policy_token_fraction"] == 0.0 and stale["max_version_lag"] == 0
    )
    assert stale["masked_stale_tokens"] == 0 and stale["multi_version_samples"] == 0


def test_the_trainers_reward_mean_leaves_failed_samples_out():
    batch = build_train_batch([_group([1.0, 0.0, None])], pad_token_id=0, current_version=0)
    batch = dataclasses.replace(batch, old_logprobs=batch.rollout_logprobs.clone())
    metrics = rl_batch_metrics(batch)
    assert metrics["reward_mean"] == 0.5 and metrics["advantage_abs_mean"] == pytest.approx(
        0.5**0.5, rel=1e-4
    )  # +-(0.5 / 0.7071)


async def test_eval_accuracy_leaves_failed_samples_out():
    async def reward(sample):  # prompt "a": right, wrong, broken, right
        if sample.index == 2:
            raise RuntimeError("verifier crashed")
        return 1.0 if sample.index != 1 else 0.0

    out = await evaluate(
        [PromptRow(index=0, prompt="a", label="x")],
        pool=FakePool(),
        tokenize=lambda t: [1, 3 + ord(t)],
        decode=lambda ids: "",
        reward_fn=reward,
        max_response_len=8,
        engine_version=0,
        reward_timeout_s=5,
        temperature=1.0,
        n_samples_per_prompt=4,
    )
    assert out["failed"] == 1.0 and out["accuracy"] == pytest.approx(2 / 3)
    assert out["pass@1"] == pytest.approx(2 / 3) and out["pass@2"] == 1.0  # pass@2 over the 3 counted samples, 2 right
    assert math.isnan(out["pass@4"])  # 3 counted samples cannot estimate pass@4


def test_a_failed_samples_old_tokens_do_not_get_its_group_dropped_as_stale():
    """The staleness drop looks at the samples that count, like the filter, GRPO and the metrics."""

    def sample(index: int, version: int, status: Status) -> Sample:
        s = Sample(prompt_ids=[1], index=index)
        s.append([5, 6], [-0.1, -0.2], version, trainable=True)
        s.status = status
        return s

    sched = types.SimpleNamespace(engine_version=9, config=types.SimpleNamespace(max_staleness=2))
    assert not Scheduler._too_stale(
        sched, Group(group_id=0, samples=[sample(0, 9, Status.COMPLETED), sample(1, 1, Status.FAILED)])
    )
    assert Scheduler._too_stale(
        sched, Group(group_id=1, samples=[sample(0, 9, Status.COMPLETED), sample(1, 1, Status.COMPLETED)])
    )
