"""Issue 30: the off-policy metrics count what trains (after the staleness mask), and the length bias of a batch
against the draws completed in the same window (``length_bias``, ``DataBuffer.pop_completed``)."""

from __future__ import annotations

import math

import pytest

from slime.loop.buffer import DataBuffer
from slime.loop.offpolicy import apply_staleness, length_bias
from slime.step_record import StepRecord
from slime.types import OFFLINE_VERSION, Group, Sample, Status


def _sample(versions: list[int], *, reward: float = 1.0, index: int = 0) -> Sample:
    s = Sample(prompt_ids=[1, 2], index=index)
    for v in versions:
        s.append([7], [-0.5], policy_version=v)
    s.status, s.reward = Status.COMPLETED, reward
    return s


def test_lag_metrics_count_only_the_tokens_left_to_train():
    # trainer 6, max_staleness 2: lags [3, 3, 1, 0] -> the two lag-3 tokens are masked and out of every share
    stale = apply_staleness([Group(group_id=0, samples=[_sample([3, 3, 5, 6])])], trainer_version=6, max_staleness=2)
    assert stale["lag_histogram"] == {0: 1, 1: 1}
    assert stale["off_policy_token_fraction"] == 0.5 and stale["max_version_lag"] == 1
    assert stale["masked_stale_tokens"] == 2 and stale["masked_token_fraction"] == 0.5
    assert stale["fully_masked_samples"] == 0 and stale["max_versions_in_a_sample"] == 3


def test_a_sample_masked_whole_is_counted_and_adds_no_lag():
    group = Group(group_id=0, samples=[_sample([1, 1, 1]), _sample([6, 6], index=1)])
    stale = apply_staleness([group], trainer_version=6, max_staleness=2)
    assert stale["fully_masked_samples"] == 1 and stale["lag_histogram"] == {0: 2}
    assert stale["off_policy_token_fraction"] == 0.0 and stale["masked_token_fraction"] == pytest.approx(3 / 5)


def test_an_unbiased_batch_reads_ratio_one_and_its_own_long_share():
    samples = [_sample([5] * n, reward=float(n % 2), index=i) for i, n in enumerate([2, 4, 6, 8])]
    completed = [(len(s.response_ids), s.reward or 0.0) for s in samples]
    bias = length_bias([Group(group_id=0, samples=samples)], completed, trainer_version=5)
    assert bias["len_ratio"] == 1.0 and bias["reward_gap"] == 0.0
    assert bias["long_share"] == bias["long_share_completed"] == 0.25  # p75 of [2, 4, 6, 8] is 6.5: only 8
    assert bias["long_token_share"] == 1.0 and bias["age_short"] == bias["age_long"] == 0.0


def test_a_batch_of_the_short_draws_and_a_masked_long_one_reads_the_bias():
    # completed in the window: lengths 2, 2, 2, 10 (p75 = 4); trained: one short (fresh) and one long whose
    # first 6 tokens are over-stale (masked), the other 4 one version old
    short, long_ = _sample([6, 6], reward=1.0), _sample([1] * 6 + [5] * 4, reward=0.0, index=1)
    groups = [Group(group_id=0, samples=[short, long_])]
    apply_staleness(groups, trainer_version=6, max_staleness=2)
    bias = length_bias(groups, [(2, 1.0), (2, 1.0), (2, 1.0), (10, 0.0)], trainer_version=6)
    assert bias["len_ratio"] == pytest.approx(6 / 4) and bias["reward_gap"] == pytest.approx(0.5 - 0.75)
    assert bias["long_share"] == 0.5 and bias["long_share_completed"] == 0.25
    assert bias["long_token_share"] == pytest.approx(0.4) and bias["age_long"] == 1.0 and bias["age_short"] == 0.0


def test_a_fully_masked_sample_is_not_a_trained_one():
    masked, kept = _sample([0] * 8, index=0), _sample([4, 4], index=1)
    groups = [Group(group_id=0, samples=[masked, kept])]
    apply_staleness(groups, trainer_version=4, max_staleness=1)
    bias = length_bias(groups, [(8, 1.0), (2, 1.0)], trainer_version=4)
    assert bias["len_ratio"] == pytest.approx(2 / 5) and bias["long_share"] == 0.0 and math.isnan(bias["age_long"])
    assert length_bias(groups, [], trainer_version=4) == {}, "nothing completed: no comparison"


def test_the_buffer_counts_online_ready_samples_as_completed_once():
    buf = DataBuffer()
    buf.push_ready(Group(group_id=0, samples=[_sample([0, 0, 0], reward=0.0), _sample([0], index=1)]))
    offline = _sample([OFFLINE_VERSION] * 5)
    buf.push_ready(Group(group_id=1, samples=[offline]), front=True)
    failed = _sample([0, 0])
    failed.status = Status.FAILED
    buf.push_ready(Group(group_id=2, samples=[failed]))
    assert buf.pop_completed() == [(3, 0.0), (1, 1.0)], "offline and FAILED samples are no draws"
    assert buf.pop_completed() == []


def test_the_step_record_writes_and_reads_the_bias_group():
    row = StepRecord(bias={"len_ratio": 0.8}, masked_token_fraction=0.25, fully_masked_samples=2).to_dict()
    assert row["bias/len_ratio"] == 0.8 and row["masked_token_fraction"] == 0.25
    back = StepRecord.from_row(row)
    assert back.bias == {"len_ratio": 0.8} and back.fully_masked_samples == 2


def test_newest_only_masks_before_the_metrics_count_and_agrees_with_the_trainers_batch():
    """--mask-offpolicy-in-partial-rollout: versions [4, 4, 5] at trainer 5 -> one token trains, with lag 0; the
    loop's counts are the trainer's loss-mask sum, and a sample of one version is untouched."""
    from slime.train.batch import build_train_batch

    group = Group(group_id=0, samples=[_sample([4, 4, 5]), _sample([5, 5], index=1)])
    stale = apply_staleness([group], trainer_version=5, max_staleness=4, newest_only=True)
    assert stale["lag_histogram"] == {0: 3} and stale["off_policy_token_fraction"] == 0.0
    assert stale["masked_stale_tokens"] == 2 and stale["trained_samples"] == 2
    batch = build_train_batch([group], pad_token_id=0, current_version=5, mask_offpolicy_in_partial_rollout=True)
    assert batch.num_train_tokens == sum(stale["lag_histogram"].values())


def test_a_step_that_trains_nothing_has_no_off_policy_share():
    stale = apply_staleness([Group(group_id=0, samples=[_sample([1, 1])])], trainer_version=6, max_staleness=2)
    assert stale["fully_masked_samples"] == 1 and stale["trained_samples"] == 0
    assert math.isnan(stale["off_policy_token_fraction"]) and stale["lag_histogram"] == {}
