"""The clipped surrogate (with TIS weights, dual clip, GSPO ratio, entropy bonus) against hand-computed examples.

Sample A (advantage +1, 3 trained tokens) and sample B (advantage -1, 2 trained tokens + 1 masked).
eps_clip = 0.2, eps_clip_high = 0.28, tis_clip = 2, tis_clip_low = 0.

    token   ratio  clip(ratio)  -min(rA, clip*A)  TIS w = exp(old - rollout)  loss_tok
    A0      1.5    1.28         -1.28 (clipped)   1                            -1.28
    A1      1.0    1.0          -1.0              3 -> truncated to 2          -2.0
    A2      1.0    1.0          -1.0              1                            -1.0
    B0      0.9    0.9           0.9              0.5                          0.45
    B1      1.0    1.0           1.0              1                            1.0
    seq_mean   = (mean(A) + mean(B)) / 2 = (-4.28/3 + 1.45/2) / 2 = -0.350833
    token_mean = (-4.28 + 1.45) / 5 = -0.566
"""

import math

import pytest
import torch

from slime.train.losses import aggregate, policy_loss
from slime.train.offpolicy import tis_weights

LN = math.log
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
NEW = torch.tensor([[-1.0 + LN(1.5), -1.0, -1.0], [-2.0 + LN(0.9), -2.0, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -1.0 - LN(3.0), -1.0], [-2.0 + LN(2.0), -2.0, -2.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def _loss(use_tis=False, **kw):
    logprobs = NEW.clone().requires_grad_(True)
    weights, tis_metrics = tis_weights(OLD, ROLLOUT, MASK, tis_clip=2.0, tis_clip_low=0.0) if use_tis else (None, {})
    loss, metrics = policy_loss(
        logprobs, OLD, ADV * MASK, MASK, is_weights=weights, **{"eps_clip": 0.2, "eps_clip_high": 0.28, **kw}
    )
    loss.backward()
    return loss, {**metrics, **tis_metrics}, logprobs.grad


def test_clipped_loss_with_tis_matches_hand_computed_seq_mean():
    loss, metrics, grad = _loss(use_tis=True)
    assert loss.item() == pytest.approx((-4.28 / 3 + 1.45 / 2) / 2, abs=1e-6)
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 5)
    assert metrics["tis_mean"] == pytest.approx((1 + 2 + 1 + 0.5 + 1) / 5, abs=1e-6)
    assert metrics["tis_clipfrac"] == pytest.approx(1 / 5)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 1 + 1 + 0.9 + 1) / 5, abs=1e-6)
    k3 = (0.5 - LN(1.5)) + (-0.1 - LN(0.9))  # r - 1 - log r on the two tokens with r != 1
    assert metrics["approx_kl"] == pytest.approx(k3 / 5, abs=1e-6)
    assert metrics["num_tokens"] == 5
    # d loss / d logp = -ratio * A * w / (tokens in sample * samples); 0 where the clip is active
    want = torch.tensor([[0.0, -2 / 6, -1 / 6], [0.9 * 0.5 / 4, 1 / 4, 0.0]])
    torch.testing.assert_close(grad, want, atol=1e-6, rtol=0)


def test_token_mean_divides_by_all_trained_tokens():
    loss, _, _ = _loss(use_tis=True, loss_agg="token_mean")
    assert loss.item() == pytest.approx((-4.28 + 1.45) / 5, abs=1e-6)


def test_without_tis_rollout_logprobs_are_ignored():
    loss, metrics, _ = _loss(use_tis=False)
    assert loss.item() == pytest.approx((-3.28 / 3 + 1.9 / 2) / 2, abs=1e-6)
    assert "tis_mean" not in metrics


def test_symmetric_clip_when_eps_clip_high_is_none():
    loss, _, _ = _loss(use_tis=False, eps_clip_high=None)
    assert loss.item() == pytest.approx((-3.2 / 3 + 1.9 / 2) / 2, abs=1e-6)


@pytest.mark.parametrize(
    ("ratio", "adv", "clipped"), [(1.5, 1.0, True), (0.5, -1.0, True), (0.5, 1.0, False), (1.5, -1.0, False)]
)
def test_clip_stops_gradient_only_where_it_is_pessimistic(ratio, adv, clipped):
    logprobs = torch.tensor([[LN(ratio)]], requires_grad=True)
    loss, metrics = policy_loss(logprobs, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), eps_clip=0.2)
    loss.backward()
    assert metrics["pg_clipfrac"] == float(clipped)
    assert (logprobs.grad.item() == 0.0) == clipped


def test_loss_denominator_lets_micro_batches_sum_to_the_full_batch_loss():
    full, _, _ = _loss(use_tis=True)
    weights, _ = tis_weights(OLD, ROLLOUT, MASK, tis_clip=2.0)
    parts = [
        policy_loss(
            NEW[i : i + 1],
            OLD[i : i + 1],
            ADV[i : i + 1] * MASK[i : i + 1],
            MASK[i : i + 1],
            is_weights=weights[i : i + 1],
            loss_denominator=2.0,
            eps_clip=0.2,
            eps_clip_high=0.28,
        )[0]
        for i in range(2)
    ]
    assert sum(p.item() for p in parts) == pytest.approx(full.item(), abs=1e-6)


def test_fully_masked_batch_gives_zero_loss_and_zero_grad():
    logprobs = NEW.clone().requires_grad_(True)
    loss, metrics = policy_loss(logprobs, OLD, ADV, torch.zeros_like(MASK), eps_clip=0.2)
    loss.backward()
    assert loss.item() == 0.0 and metrics["num_tokens"] == 0.0
    assert torch.equal(logprobs.grad, torch.zeros_like(NEW))


def test_is_weights_of_another_shape_raise():
    with pytest.raises(ValueError, match="is_weights"):
        policy_loss(NEW, OLD, ADV, MASK, eps_clip=0.2, is_weights=torch.ones(2, 2))


def test_dual_clip_caps_the_loss_of_negative_advantage_tokens_at_c_times_minus_a():
    # eps 0.2, c = 3; one sample of three tokens:
    #   A = -1, ratio 5: PPO loss max(5, 1.2) = 5 -> capped at -c * A = 3 (constant: no gradient)
    #   A = -1, ratio 2: PPO loss max(2, 1.2) = 2 <= 3 -> 2 (gradient -A * ratio = 2)
    #   A = +1, ratio 5: PPO loss max(-5, -1.2) = -1.2 (clip active; dual clip only acts on A < 0)
    # seq_mean = (3 + 2 - 1.2) / 3 = 1.266667
    logprobs = torch.tensor([[LN(5.0), LN(2.0), LN(5.0)]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, metrics = policy_loss(logprobs, torch.zeros(1, 3), adv, torch.ones(1, 3), eps_clip=0.2, eps_clip_c=3.0)
    loss.backward()
    assert loss.item() == pytest.approx(3.8 / 3, abs=1e-6)
    assert metrics["dual_clipfrac"] == pytest.approx(1 / 3)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 2.0 / 3, 0.0]]))
    without, _ = policy_loss(logprobs, torch.zeros(1, 3), adv, torch.ones(1, 3), eps_clip=0.2)
    assert without.item() == pytest.approx(5.8 / 3, abs=1e-6)


def test_gspo_clips_one_length_normalised_ratio_per_sample():
    # eps_clip 3e-4, eps_clip_high 4e-4 (the GSPO paper's values):
    #   sample 0: log ratios [0.1, 0.3] -> mean 0.2 -> s = e^0.2 = 1.221403 > 1.0004; A = +1
    #             -> loss -1.0004 on both tokens, clipped, no gradient
    #   sample 1: log ratios [0.0002, -0.0002] -> mean 0 -> s = 1 (token ratios would differ); A = -1
    #             -> loss +1, gradient d(-A * s)/d logp_t = s / 2 per token, then / 2 samples = 0.25
    # seq_mean = (-1.0004 + 1) / 2 = -0.0002
    logprobs = torch.tensor([[0.1, 0.3], [0.0002, -0.0002]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, metrics = policy_loss(
        logprobs, torch.zeros(2, 2), adv, torch.ones(2, 2), eps_clip=3e-4, eps_clip_high=4e-4, ratio_level="sequence"
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.0002, abs=1e-6)
    assert metrics["pg_clipfrac"] == 0.5 and metrics["ratio_mean"] == pytest.approx(
        (2 * math.exp(0.2) + 2) / 4, abs=1e-6
    )
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.0], [0.25, 0.25]]))


def test_entropy_bonus_subtracts_coef_times_aggregated_entropy():
    # ratio 1 and A = 0, so the clipped term is 0; entropies [0.5, 1.5] in one sample, coef 0.1:
    # loss = -0.1 * (0.5 + 1.5) / 2 = -0.1; d loss / d entropy = -0.1 / 2 per token
    entropy = torch.tensor([[0.5, 1.5]], requires_grad=True)
    loss, metrics = policy_loss(
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        torch.ones(1, 2),
        eps_clip=0.2,
        entropy=entropy,
        entropy_coef=0.1,
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.1) and metrics["entropy"] == pytest.approx(1.0)
    torch.testing.assert_close(entropy.grad, torch.tensor([[-0.05, -0.05]]))


def test_aggregate_seq_mean_and_token_mean_by_hand():
    # masks [1, 1, 0] and [1, 0, 0]: seq_mean = ((1 + 3) / 2 + 4) / 2 = 3; token_mean = 8 / 3
    x, mask = torch.tensor([[1.0, 3.0, 9.0], [4.0, 9.0, 9.0]]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(x, mask, loss_agg="seq_mean").item() == pytest.approx(3.0)
    assert aggregate(x, mask, loss_agg="token_mean").item() == pytest.approx(8 / 3)
