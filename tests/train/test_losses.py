"""The clipped surrogate and TIS weights against a hand-computed 2-sample example.

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

from slime.train.losses import policy_loss

LN = math.log
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
NEW = torch.tensor([[-1.0 + LN(1.5), -1.0, -1.0], [-2.0 + LN(0.9), -2.0, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -1.0 - LN(3.0), -1.0], [-2.0 + LN(2.0), -2.0, -2.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
KW = dict(eps_clip=0.2, eps_clip_high=0.28, tis_clip=2.0, tis_clip_low=0.0)


def _loss(**kw):
    logprobs = NEW.clone().requires_grad_(True)
    loss, metrics = policy_loss(logprobs, OLD, ADV * MASK, MASK, rollout_logprobs=ROLLOUT, **{**KW, **kw})
    loss.backward()
    return loss, metrics, logprobs.grad


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


@pytest.mark.parametrize(("ratio", "adv", "clipped"), [(1.5, 1.0, True), (0.5, -1.0, True), (0.5, 1.0, False), (1.5, -1.0, False)])
def test_clip_stops_gradient_only_where_it_is_pessimistic(ratio, adv, clipped):
    logprobs = torch.tensor([[LN(ratio)]], requires_grad=True)
    loss, metrics = policy_loss(logprobs, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), eps_clip=0.2)
    loss.backward()
    assert metrics["pg_clipfrac"] == float(clipped)
    assert (logprobs.grad.item() == 0.0) == clipped


def test_loss_denominator_lets_micro_batches_sum_to_the_full_batch_loss():
    full, _, _ = _loss(use_tis=True)
    parts = [
        policy_loss(NEW[i : i + 1], OLD[i : i + 1], ADV[i : i + 1] * MASK[i : i + 1], MASK[i : i + 1],
                    rollout_logprobs=ROLLOUT[i : i + 1], use_tis=True, loss_denominator=2.0, **KW)[0]
        for i in range(2)
    ]
    assert sum(p.item() for p in parts) == pytest.approx(full.item(), abs=1e-6)


def test_fully_masked_batch_gives_zero_loss_and_zero_grad():
    logprobs = NEW.clone().requires_grad_(True)
    loss, metrics = policy_loss(logprobs, OLD, ADV, torch.zeros_like(MASK), eps_clip=0.2)
    loss.backward()
    assert loss.item() == 0.0 and metrics["num_tokens"] == 0.0
    assert torch.equal(logprobs.grad, torch.zeros_like(NEW))


def test_use_tis_without_rollout_logprobs_raises():
    with pytest.raises(ValueError, match="rollout_logprobs"):
        policy_loss(NEW, OLD, ADV, MASK, eps_clip=0.2, use_tis=True)
