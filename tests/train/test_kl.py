"""KL estimators against Schulman's formulas, worked by hand.

Three tokens, log_ratio = logp - logp_ref and r = exp(-log_ratio):

    token  logp   ref    log_ratio   k1     k2 = lr^2/2   k3 = r - 1 - log r = e^-lr - 1 + lr
    0      -1     -2      1          1      0.5           e^-1 - 1 + 1 = 0.367879
    1      -2     -1     -1         -1      0.5           e^1 - 1 - 1  = 0.718282
    2      -20     0    -20        -20      200           e^20 - 21    = 4.85165e8 (low_var_kl: clamped to 10)
"""

import math

import pytest
import torch

from slime.train.kl import kl_estimate

LOGP = torch.tensor([[-1.0, -2.0, -20.0]])
REF = torch.tensor([[-2.0, -1.0, 0.0]])


@pytest.mark.parametrize(
    ("kl_type", "want"),
    [
        ("k1", [1.0, -1.0, -20.0]),
        ("k2", [0.5, 0.5, 200.0]),
        ("k3", [math.exp(-1), math.e - 2.0, math.exp(20) - 21.0]),
        ("low_var_kl", [math.exp(-1), math.e - 2.0, 10.0]),
    ],
)
def test_kl_estimators_match_hand_computed_values(kl_type, want):
    got = kl_estimate(LOGP, REF, kl_type)
    torch.testing.assert_close(got, torch.tensor([want]), rtol=1e-5, atol=1e-5)


def test_k3_gradient_pulls_logp_towards_the_reference():
    # d k3 / d logp = 1 - exp(ref - logp): token 0 (logp above ref) -> 1 - e^-1 > 0, token 1 -> 1 - e < 0
    logp = LOGP[:, :2].clone().requires_grad_(True)
    kl_estimate(logp, REF[:, :2], "k3").sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[1 - math.exp(-1), 1 - math.e]]))


def test_unknown_kl_type_raises():
    with pytest.raises(ValueError, match="kl_type"):
        kl_estimate(LOGP, REF, "k4")
