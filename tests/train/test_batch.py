import math

import pytest
import torch

from slime.train.batch import build_train_batch
from slime.types import Group, Sample, Status

PAD = 0


def _sample(prompt, response, reward, *, version=3, status=Status.COMPLETED, loss_mask=None, index=0):
    s = Sample(prompt_ids=list(prompt), group_id=7, index=index, status=status, reward=reward)
    s.append(response, [-0.1 * (j + 1) for j in range(len(response))], policy_version=version)
    if loss_mask is not None:
        s.loss_mask = list(loss_mask)
    return s


def test_layout_puts_response_logprobs_at_the_positions_that_predict_them():
    # prompt of 3, response of 4 -> T = 8 (the other sample is longer), response positions t = 2..5
    a = _sample([11, 12, 13], [21, 22, 23, 24], 1.0, loss_mask=[1, 1, 0, 1])
    b = _sample([11, 12, 13, 14], [31, 32, 33, 34], 0.0, index=1)
    batch = build_train_batch([Group(group_id=7, samples=[a, b])], pad_token_id=PAD, current_version=4)
    assert batch.input_ids.tolist() == [[11, 12, 13, 21, 22, 23, 24, PAD], [11, 12, 13, 14, 31, 32, 33, 34]]
    assert batch.attention_mask.tolist() == [[1] * 7 + [0], [1] * 8]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 0, 1, 0], [0, 0, 0, 1, 1, 1, 1]]
    torch.testing.assert_close(batch.rollout_logprobs[0], torch.tensor([0, 0, -0.1, -0.2, -0.3, -0.4, 0]))
    assert batch.staleness[0].tolist() == [0, 0, 1, 1, 1, 1, 0]
    # rewards 1, 0 -> centred +-0.5, unbiased std sqrt(0.5) -> +-0.7071 on every response position
    adv = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(batch.sample_advantages, torch.tensor([adv, -adv]), atol=1e-5, rtol=0)
    torch.testing.assert_close(batch.advantages[0], torch.tensor([0, 0, adv, adv, adv, adv, 0]), atol=1e-5, rtol=0)
    assert batch.num_train_tokens == 7 and batch.seq_lens.tolist() == [7, 8]


def test_failed_sample_is_left_out_of_the_batch_and_of_group_statistics():
    ok = [_sample([1, 2], [3, 4], r, index=i) for i, r in enumerate([1.0, 0.0, 1.0])]
    failed = _sample([1, 2], [5, 6], None, status=Status.FAILED, index=3)
    batch = build_train_batch(
        [Group(group_id=7, samples=ok[:2] + [failed] + ok[2:])], pad_token_id=PAD, current_version=3
    )
    assert batch.num_samples == 3 and batch.input_ids[:, 2:4].tolist() == [[3, 4]] * 3
    # the three valid rewards 1, 0, 1 alone set the mean 2/3 and the unbiased std sqrt(1/3)
    s3 = math.sqrt(3)
    torch.testing.assert_close(batch.sample_advantages, torch.tensor([s3 / 3, -2 * s3 / 3, s3 / 3]), atol=1e-5, rtol=0)


def test_a_failed_sample_costs_the_trainer_nothing_however_long():
    # a 400k-token prompt the engine refused (HTTP 400): before the fix it was laid out as a [B, 400k]
    # row and the trainer ran its forward pass over it
    ok = _sample([1, 2], [3, 4], 1.0)
    refused = Sample(prompt_ids=[7] * 400_000, group_id=7, index=1, status=Status.FAILED)
    batch = build_train_batch([Group(group_id=7, samples=[ok, refused])], pad_token_id=PAD, current_version=3)
    assert batch.input_ids.shape == (1, 4) and batch.seq_lens.tolist() == [4]


def test_a_batch_of_failed_samples_only_is_empty():
    failed = [_sample([1, 2], [3], None, status=Status.FAILED, index=i) for i in range(2)]
    batch = build_train_batch([Group(group_id=7, samples=failed)], pad_token_id=PAD, current_version=3)
    assert batch.num_samples == 0 and batch.num_train_tokens == 0 and batch.input_ids.shape[0] == 0


def test_slice_trims_to_the_longest_sequence_of_the_slice():
    a, b = _sample([1, 2], [3], 1.0), _sample([1, 2, 3, 4, 5], [6, 7], 0.0, index=1)
    batch = build_train_batch([Group(group_id=7, samples=[a, b])], pad_token_id=PAD, current_version=3)
    mb = batch.slice(0, 1)
    assert mb.input_ids.shape == (1, 3) and mb.loss_mask.shape == (1, 2)
    assert mb.loss_mask.tolist() == [[0, 1]]


def test_token_older_than_max_staleness_raises_with_the_numbers():
    s = _sample([1, 2], [3, 4], 1.0, version=1)
    with pytest.raises(RuntimeError, match="max_staleness=2.*3 versions behind current_version 4"):
        build_train_batch([Group(group_id=7, samples=[s])], pad_token_id=PAD, current_version=4, max_staleness=2)


def test_masked_stale_tokens_do_not_trip_the_staleness_check():
    s = _sample([1, 2], [3, 4], 1.0, version=1, loss_mask=[0, 0])
    batch = build_train_batch([Group(group_id=7, samples=[s])], pad_token_id=PAD, current_version=4, max_staleness=2)
    assert batch.num_train_tokens == 0


def test_sample_without_reward_raises_unless_failed():
    s = _sample([1, 2], [3], None)
    with pytest.raises(ValueError, match="no reward"):
        build_train_batch([Group(group_id=7, samples=[s])], pad_token_id=PAD, current_version=3)


def _resumed(versions, loss_mask=None, index=0):
    """A sample of 5 response tokens whose versions span a resume (e.g. [4, 4, 4, 5, 5])."""
    s = Sample(prompt_ids=[1, 2], group_id=7, index=index, status=Status.COMPLETED, reward=1.0)
    s.append([10, 11, 12, 13, 14], [-0.5] * 5, policy_version=list(versions))
    if loss_mask is not None:
        s.loss_mask = list(loss_mask)
    return s


def test_mask_offpolicy_in_partial_rollout_trains_only_the_newest_version():
    # prompt of 2 -> response positions t = 1..5; versions [4, 4, 4, 5, 5] -> only t = 4, 5 train.
    # A tool token (loss_mask 0) in the newest segment stays masked; a fresh sample is untouched.
    resumed = _resumed([4, 4, 4, 5, 5], loss_mask=[1, 1, 1, 1, 0])
    fresh = _resumed([5] * 5, index=1)
    group = Group(group_id=7, samples=[resumed, fresh])
    on = build_train_batch([group], pad_token_id=PAD, current_version=5, mask_offpolicy_in_partial_rollout=True)
    assert on.loss_mask.tolist() == [[0, 0, 0, 0, 1, 0], [0, 1, 1, 1, 1, 1]]
    assert on.response_mask.tolist() == [[0, 1, 1, 1, 1, 1]] * 2
    off = build_train_batch([group], pad_token_id=PAD, current_version=5)
    assert off.loss_mask.tolist() == [[0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]]
    assert resumed.loss_mask == [1, 1, 1, 1, 0]  # the sample itself is not modified


def test_masked_off_policy_tokens_do_not_trip_the_staleness_check():
    # versions [1, 1, 5, 5, 5] at current version 5 with max_staleness 2: the version-1 tokens are
    # 4 versions behind, but masked by the option before the check runs
    group = Group(group_id=7, samples=[_resumed([1, 1, 5, 5, 5])])
    batch = build_train_batch(
        [group], pad_token_id=PAD, current_version=5, max_staleness=2, mask_offpolicy_in_partial_rollout=True
    )
    assert batch.num_train_tokens == 3
    with pytest.raises(RuntimeError, match="max_staleness=2"):
        build_train_batch([group], pad_token_id=PAD, current_version=5, max_staleness=2)


def test_estimator_picks_the_sample_score():
    # rewards 1 and 0 in one group: GRPO +-0.7071, baseline +-0.5 (centred only), PPO the raw reward
    group = Group(group_id=7, samples=[_sample([1, 2], [3, 4], 1.0), _sample([1, 2], [5], 0.0, index=1)])
    scores = {
        est: build_train_batch(
            [group], pad_token_id=PAD, current_version=3, advantage_estimator=est
        ).sample_advantages.tolist()
        for est in ("grpo", "reinforce_plus_plus_baseline", "ppo")
    }
    assert scores["grpo"] == pytest.approx([0.7071, -0.7071], abs=1e-4)
    assert scores["reinforce_plus_plus_baseline"] == [0.5, -0.5] and scores["ppo"] == [1.0, 0.0]


def test_plan_steps_cuts_optimizer_steps_then_micro_batches_the_last_step_taking_the_remainder():
    from slime.train.batch import plan_steps

    assert plan_steps([5] * 10, global_batch_size=4, micro_batch_size=2) == [
        [[0, 1], [2, 3]],
        [[4, 5], [6, 7]],
        [[8, 9]],
    ]
    # a token budget packs each step's samples (padded to the longest) into at most 12 tokens
    assert plan_steps([6, 6, 6, 2], global_batch_size=4, micro_batch_size=1, max_tokens_per_gpu=12) == [
        [[0, 1], [2, 3]]
    ]
