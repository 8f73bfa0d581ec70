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


def test_failed_sample_is_masked_and_left_out_of_group_statistics():
    ok = [_sample([1, 2], [3, 4], r, index=i) for i, r in enumerate([1.0, 0.0, 1.0])]
    failed = _sample([1, 2], [5, 6], None, status=Status.FAILED, index=3)
    batch = build_train_batch([Group(group_id=7, samples=ok + [failed])], pad_token_id=PAD, current_version=3)
    assert batch.loss_mask[3].sum() == 0 and batch.advantages[3].abs().sum() == 0
    assert math.isnan(batch.rewards[3])
    # the three valid rewards 1, 0, 1 alone set the mean 2/3 and the unbiased std sqrt(1/3)
    s3 = math.sqrt(3)
    torch.testing.assert_close(batch.sample_advantages, torch.tensor([s3 / 3, -2 * s3 / 3, s3 / 3, 0.0]), atol=1e-5, rtol=0)


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
