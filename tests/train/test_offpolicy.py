"""TIS, MIS (token / sequence / geometric) and decoupled-PPO weights against a hand-worked 2-sample example.

log r = old_logp - rollout_logp on the trained tokens (sample B's third position is masked):

    sample A: log r = [0, ln 3, ln 0.25]   ->  r = [1, 3, 0.25]
    sample B: log r = [ln 3, 0, (masked)]  ->  r = [3, 1, -]

    TIS, clip [0, 2]:        A [1, 2, 0.25]         B [2, 1, 0]
    TIS sequence (slime's --tis-level): A 0.75 -> [0.75] * 3   B 3 -> 2 -> [2, 2, 0]
    TIS geometric:           A [0.908560] * 3       B [1.732051, 1.732051, 0]
    MIS token [0.5, 2]:      A [1, 0, 0]            B [0, 1, 0]          (3 > 2, 0.25 < 0.5 masked)
    MIS sequence:            A rho = 3 * 0.25 = 0.75 (kept)   -> [0.75] * 3
                             B rho = 3 * 1 = 3 > 2 (masked)   -> [0, 0, 0]
    MIS geometric:           A rho = 0.75 ** (1/3) = 0.908560 -> [0.908560] * 3
                             B rho = 3 ** (1/2) = 1.732051    -> [1.732051, 1.732051, 0]
    decoupled, cap 2:        A [1, 0, 0.25]         B [0, 1, 0]
    decoupled, no cap:       A [1, 3, 0.25]         B [3, 1, 0]
"""

import math
from types import SimpleNamespace

import pytest
import torch

from slime.train.losses import policy_loss
from slime.train.offpolicy import decoupled_weights, mis_weights, tis_weights

LN = math.log
ROLLOUT = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
LOG_R = torch.tensor([[0.0, LN(3.0), LN(0.25)], [LN(3.0), 0.0, 5.0]])  # the 5.0 sits on a masked position
OLD = ROLLOUT + LOG_R
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
G = 0.75 ** (1 / 3)
S3 = math.sqrt(3.0)


@pytest.mark.parametrize(
    "level, want",
    [
        ("sequence", [[0.75, 0.75, 0.75], [2.0, 2.0, 0.0]]),
        ("geometric", [[G, G, G], [S3, S3, 0.0]]),
    ],
)
def test_tis_at_sequence_and_geometric_level_truncates_one_ratio_per_sample(level, want):
    w, m = tis_weights(OLD, ROLLOUT, MASK, tis_clip=2.0, tis_clip_low=0.0, level=level)
    torch.testing.assert_close(w, torch.tensor(want))
    assert m["tis_clipfrac"] == pytest.approx(2 / 5 if level == "sequence" else 0.0)


def test_tis_level_reaches_the_loss_from_the_flag():
    from slime.cli.args import build_parser, config_from_args
    from slime.errors import ConfigError
    from slime.train.objective import correction_weights

    cfg = config_from_args(build_parser().parse_args(["--use-tis", "--tis-level", "geometric"])).train
    w, _ = correction_weights(cfg, SimpleNamespace(old_logprobs=OLD, rollout_logprobs=ROLLOUT, loss_mask=MASK))
    torch.testing.assert_close(w, torch.tensor([[G, G, G], [S3, S3, 0.0]]))
    with pytest.raises(ConfigError, match="--tis-level"):  # without --use-tis it would weight nothing
        config_from_args(build_parser().parse_args(["--tis-level", "sequence"]))


def test_tis_truncates_each_token_ratio():
    w, m = tis_weights(OLD, ROLLOUT, MASK, tis_clip=2.0, tis_clip_low=0.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 0.25], [2.0, 1.0, 0.0]]))
    assert m["tis_clipfrac"] == pytest.approx(2 / 5) and m["tis_mean"] == pytest.approx(6.25 / 5)


@pytest.mark.parametrize(
    ("level", "want"),
    [
        ("token", [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
        ("sequence", [[0.75, 0.75, 0.75], [0.0, 0.0, 0.0]]),
        ("geometric", [[G, G, G], [S3, S3, 0.0]]),
    ],
)
def test_mis_masks_tokens_or_samples_outside_the_bounds(level, want):
    w, _ = mis_weights(OLD, ROLLOUT, MASK, level=level, lower_bound=0.5, upper_bound=2.0)
    torch.testing.assert_close(w, torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_mis_metrics_count_masked_tokens_below_and_above():
    # token level: A's 0.25 is below, A's 3 and B's 3 are above, over 5 trained tokens
    _, m = mis_weights(OLD, ROLLOUT, MASK, level="token", lower_bound=0.5, upper_bound=2.0)
    assert m["mis_mask_frac_low"] == pytest.approx(1 / 5) and m["mis_mask_frac_high"] == pytest.approx(2 / 5)
    assert m["mis_rho_mean"] == pytest.approx((1 + 3 + 0.25 + 3 + 1) / 5)


def test_mis_sequence_log_ratio_is_clamped_before_exp():
    old = ROLLOUT + torch.tensor([[30.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    w, m = mis_weights(old, ROLLOUT, MASK, level="sequence", lower_bound=0.0, upper_bound=float("inf"))
    assert math.isfinite(m["mis_rho_mean"]) and w[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_masked_tokens_keep_their_place_in_the_denominator():
    # ratio 1, A = +1, MIS token weights A [1, 0, 0], B [0, 1]: per-token loss = -w
    # seq_mean = (-(1 + 0 + 0) / 3 + -(0 + 1) / 2) / 2 = (-1/3 - 1/2) / 2 = -0.416667
    w, _ = mis_weights(OLD, ROLLOUT, MASK, level="token", lower_bound=0.5, upper_bound=2.0)
    loss, _ = policy_loss(OLD, OLD, torch.ones_like(OLD), MASK, eps_clip=0.2, is_weights=w)
    assert loss.item() == pytest.approx(-5 / 12, abs=1e-6)


@pytest.mark.parametrize(
    ("cap", "want"), [(2.0, [[1.0, 0.0, 0.25], [0.0, 1.0, 0.0]]), (None, [[1.0, 3.0, 0.25], [3.0, 1.0, 0.0]])]
)
def test_decoupled_behaviour_weights_are_filtered_above_the_cap(cap, want):
    w, m = decoupled_weights(OLD, ROLLOUT, MASK, behav_imp_weight_cap=cap)
    torch.testing.assert_close(w, torch.tensor(want))
    assert m["behav_mask_frac"] == pytest.approx(0.4 if cap else 0.0)


def test_decoupled_ppo_clips_around_the_proximal_policy_and_weights_by_the_behaviour_ratio():
    # sample A only; current/proximal ratio [1.5, 1, 1], A = +1, eps 0.2 -> clipped losses [-1.2, -1, -1]
    # times behaviour weights (cap 2) [1, 0, 0.25] -> [-1.2, 0, -0.25] -> mean -1.45 / 3 = -0.483333
    # without the cap the weights are [1, 3, 0.25] -> (-1.2 - 3 - 0.25) / 3 = -1.483333
    prox, behav, mask = OLD[:1], ROLLOUT[:1], MASK[:1]
    logp = prox + torch.tensor([[LN(1.5), 0.0, 0.0]])
    for cap, want in ((2.0, -1.45 / 3), (None, -4.45 / 3)):
        w, _ = decoupled_weights(prox, behav, mask, behav_imp_weight_cap=cap)
        loss, m = policy_loss(logp, prox, torch.ones_like(logp), mask, eps_clip=0.2, is_weights=w)
        assert loss.item() == pytest.approx(want, abs=1e-6) and m["pg_clipfrac"] == pytest.approx(1 / 3)
