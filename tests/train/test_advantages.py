import math

import pytest
import torch

from slime.train.advantages import grpo_advantages

SQRT3_2 = math.sqrt(3) / 2  # 0.8660: 0.5 / unbiased std of [1, 0, 0, 1] (= sqrt(1/3))


def test_grpo_advantages_match_hand_computed_unbiased_std():
    # group 0: rewards 1,0,0,1 -> mean 0.5, centred +-0.5, std sqrt(1/3) -> +-0.8660
    # group 1: rewards 2,0,1,1 -> mean 1, centred 1,-1,0,0, std sqrt(2/3) = 0.8165 -> +-1.2247
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]])
    adv = grpo_advantages(rewards)
    want = torch.tensor([[SQRT3_2, -SQRT3_2, -SQRT3_2, SQRT3_2], [1.2247449, -1.2247449, 0.0, 0.0]])
    torch.testing.assert_close(adv, want, atol=1e-5, rtol=0)


def test_dr_grpo_only_centres_rewards():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]])
    adv = grpo_advantages(rewards, normalize_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]]))


def test_grpo_advantages_equal_torch_std_reference():
    rewards = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    want = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(grpo_advantages(rewards), want)


def test_group_with_equal_rewards_gets_zero_advantage_not_nan():
    adv = grpo_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(adv, torch.zeros(2, 3))


def test_invalid_samples_are_left_out_of_mean_and_std():
    # valid rewards 1, 0, 1 -> mean 2/3, centred 1/3, -2/3, 1/3, unbiased std sqrt(1/3)
    rewards = torch.tensor([[1.0, float("nan"), 0.0, 1.0]])
    valid = torch.tensor([[True, False, True, True]])
    adv = grpo_advantages(rewards, valid_mask=valid)
    s = math.sqrt(3)
    torch.testing.assert_close(adv, torch.tensor([[s / 3, 0.0, -2 * s / 3, s / 3]]), atol=1e-5, rtol=0)


def test_group_with_one_valid_sample_gets_zero_advantage():
    adv = grpo_advantages(torch.tensor([[5.0, 0.0]]), valid_mask=torch.tensor([[True, False]]))
    assert torch.equal(adv, torch.zeros(1, 2))


def test_rewards_must_be_two_dimensional():
    with pytest.raises(ValueError, match="num_groups"):
        grpo_advantages(torch.zeros(4))
