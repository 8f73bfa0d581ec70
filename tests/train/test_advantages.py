import math

import pytest
import torch

from slime.train.advantages import (
    discounted_returns,
    gae,
    grpo_advantages,
    masked_whiten,
    sample_scores,
    token_advantages,
)

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


# Batch layout of the estimator tests below ([B, L] = [2, 4], position 0 predicts the last prompt token):
#   sample 0: response positions 1..3, all trained;  sample 1: response positions 1..2, position 3 is padding.
RESPONSE = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])


def _whiten_by_hand(values, mean, var):
    return [(v - mean) / math.sqrt(var + 1e-8) for v in values]


def test_sample_scores_per_estimator():
    # rewards 1, 0, 0.5: mean 0.5; GRPO: centred [0.5, -0.5, 0] / unbiased std 0.5 = [1, -1, 0]
    r, valid = torch.tensor([[1.0, 0.0, 0.5]]), torch.ones(1, 3, dtype=torch.bool)
    torch.testing.assert_close(
        sample_scores(r, valid, estimator="grpo"), torch.tensor([[1.0, -1.0, 0.0]]), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        sample_scores(r, valid, estimator="grpo", normalize_by_std=False), torch.tensor([[0.5, -0.5, 0.0]])
    )
    torch.testing.assert_close(
        sample_scores(r, valid, estimator="reinforce_plus_plus_baseline"), torch.tensor([[0.5, -0.5, 0.0]])
    )
    torch.testing.assert_close(sample_scores(r, valid, estimator="ppo"), r)


def test_reinforce_plus_plus_discounts_reward_and_kl_then_whitens_over_trained_tokens():
    # gamma 0.5, kl_coef 0.1, sample 0 reward 1 with KL [1, 0, 2] -> rewards [-0.1, 0, 1 - 0.2 = 0.8]
    #   returns: t3 = 0.8, t2 = 0 + 0.5 * 0.8 = 0.4, t1 = -0.1 + 0.5 * 0.4 = 0.1
    # sample 1 reward 0, KL 0 -> returns [0, 0]
    # whitening over the 5 trained tokens [0.1, 0.4, 0.8, 0, 0]: mean 0.26, unbiased var 0.472 / 4 = 0.118
    kl = torch.tensor([[7.0, 1.0, 0.0, 2.0], [7.0, 0.0, 0.0, 7.0]])  # 7s sit where nothing trains
    adv, returns = token_advantages(
        "reinforce_plus_plus",
        scores=torch.tensor([1.0, 0.0]),
        loss_mask=RESPONSE,
        response_mask=RESPONSE,
        kl=kl,
        kl_coef=0.1,
        gamma=0.5,
    )
    a = _whiten_by_hand([0.1, 0.4, 0.8, 0.0, 0.0], 0.26, 0.118)
    torch.testing.assert_close(adv, torch.tensor([[0.0, a[0], a[1], a[2]], [0.0, a[3], a[4], 0.0]]), atol=1e-5, rtol=0)
    assert returns is None


def test_reinforce_plus_plus_puts_the_reward_on_the_last_trained_token():
    # response of 3 whose last token is a tool token (not trained): reward 1 lands on position 2, gamma 0.5
    loss_mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    rewards = torch.zeros(1, 4)
    rewards[0, 2] = 1.0
    torch.testing.assert_close(
        discounted_returns(rewards, RESPONSE[:1], gamma=0.5), torch.tensor([[0.0, 0.5, 1.0, 0.0]])
    )
    adv, _ = token_advantages(
        "reinforce_plus_plus", scores=torch.tensor([1.0]), loss_mask=loss_mask, response_mask=RESPONSE[:1], gamma=0.5
    )
    # whitened [0.5, 1.0]: mean 0.75, unbiased var 2 * 0.0625 / 1 = 0.125 -> -+0.25 / 0.353553 = -+0.707107
    torch.testing.assert_close(adv, torch.tensor([[0.0, -0.707107, 0.707107, 0.0]]), atol=1e-5, rtol=0)


def test_reinforce_plus_plus_baseline_subtracts_group_mean_and_kl_then_whitens():
    # group rewards 1, 0, 0.5 -> scores [0.5, -0.5, 0] (2 trained tokens each); kl_coef 0.1, sample 0 KL [1, 3]
    #   sample 0: [0.5 - 0.1, 0.5 - 0.3] = [0.4, 0.2];  sample 1: [-0.5, -0.5];  sample 2: [0, 0]
    # whitening over 6 tokens: mean -0.4 / 6 = -0.066667; squared deviations sum 0.673333 -> var / 5 = 0.134667
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    kl = torch.tensor([[0.0, 1.0, 3.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    scores = sample_scores(
        torch.tensor([[1.0, 0.0, 0.5]]), torch.ones(1, 3, dtype=torch.bool), estimator="reinforce_plus_plus_baseline"
    )[0]
    adv, _ = token_advantages(
        "reinforce_plus_plus_baseline", scores=scores, loss_mask=mask, response_mask=mask, kl=kl, kl_coef=0.1
    )
    a = _whiten_by_hand([0.4, 0.2, -0.5, -0.5, 0.0, 0.0], -0.4 / 6, 0.673333 / 5)
    torch.testing.assert_close(
        adv, torch.tensor([[0.0, a[0], a[1]], [0.0, a[2], a[3]], [0.0, a[4], a[5]]]), atol=1e-4, rtol=0
    )


def test_gae_matches_hand_computed_deltas():
    # one sample, 3 response tokens, reward 1 on the last, V = [0.5, 0.6, 0.7], gamma 0.9, lambda 0.8:
    #   delta_3 = 1 + 0 - 0.7 = 0.3;  delta_2 = 0.9 * 0.7 - 0.6 = 0.03;  delta_1 = 0.9 * 0.6 - 0.5 = 0.04
    #   A_3 = 0.3;  A_2 = 0.03 + 0.72 * 0.3 = 0.246;  A_1 = 0.04 + 0.72 * 0.246 = 0.21712
    #   returns = A + V = [0.71712, 0.846, 1.0]
    values = torch.tensor([[9.0, 0.5, 0.6, 0.7]])  # the 9 at the prompt position must not leak in
    adv, returns = token_advantages(
        "ppo",
        scores=torch.tensor([1.0]),
        loss_mask=RESPONSE[:1],
        response_mask=RESPONSE[:1],
        values=values,
        gamma=0.9,
        lambd=0.8,
    )
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.21712, 0.246, 0.3]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(returns, torch.tensor([[0.0, 0.71712, 0.846, 1.0]]), atol=1e-6, rtol=0)


def test_gae_with_lambda_one_and_gamma_one_is_return_minus_value():
    # lambda = gamma = 1: A_t = (sum of future rewards) - V_t; row 2 is shorter and padded
    rewards = torch.tensor([[0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.0, 1.0, 0.5, 0.25], [0.0, 0.2, 0.4, 5.0]])
    adv, _ = gae(rewards, values * RESPONSE, RESPONSE, gamma=1.0, lambd=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 1.0, 1.5, 1.75], [0.0, 0.8, 0.6, 0.0]]))


def test_masked_whiten_uses_unbiased_variance_of_masked_entries():
    # [1, 2, 3] (99 masked): mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> [-1, 0, 1] (slime's Bessel correction)
    got = masked_whiten(torch.tensor([1.0, 2.0, 3.0, 99.0]), torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(got, torch.tensor([-1.0, 0.0, 1.0, 0.0]), atol=1e-5, rtol=0)


def test_grpo_token_advantages_are_the_broadcast_score_unless_normalized():
    adv, _ = token_advantages("grpo", scores=torch.tensor([1.0, -2.0]), loss_mask=RESPONSE, response_mask=RESPONSE)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, -2.0, -2.0, 0.0]]))
    # --normalize-advantages: [1, 1, 1, -2, -2] -> mean -0.2, squared deviations 10.8, unbiased var 2.7
    adv, _ = token_advantages(
        "grpo", scores=torch.tensor([1.0, -2.0]), loss_mask=RESPONSE, response_mask=RESPONSE, normalize_advantages=True
    )
    a = _whiten_by_hand([1.0, -2.0], -0.2, 2.7)
    torch.testing.assert_close(adv, torch.tensor([[0.0, a[0], a[0], a[0]], [0.0, a[1], a[1], 0.0]]), atol=1e-5, rtol=0)
