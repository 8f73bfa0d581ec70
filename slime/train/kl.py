"""Per-token KL estimators between the policy and a frozen reference policy.

Source: Schulman, "Approximating KL Divergence" (joschu.net/blog/kl-approx.html). Tokens are
sampled from the current policy q, the reference is p, and with ``log r = logp_ref - logp``:

    k1 = -log r                   = logp - logp_ref          unbiased, high variance, can be < 0
    k2 = (log r)^2 / 2                                      biased, low variance, >= 0
    k3 = (r - 1) - log r                                    unbiased, low variance, >= 0

``low_var_kl`` is k3 clamped to [-10, 10], as slime does (``compute_approx_kl`` in
``slime/utils/ppo_utils.py`` clamps only that name; ``k3`` itself is left unclamped). We follow
slime exactly here, including its default ``--kl-loss-type k1``.

Example (one token, logp = -1, logp_ref = -2, so log r = -1, r = 0.36788):
    k1 = 1.0;  k2 = 0.5;  k3 = 0.36788 - 1 + 1 = 0.36788

Used twice, as in slime: ``--use-kl-loss`` adds ``kl_loss_coef * agg(k)`` to the loss (gradient
through ``logp``), and ``--kl-coef`` folds ``-kl_coef * k`` into the per-token rewards of the
REINFORCE++ and PPO (GAE) estimators (computed from the pre-update logprobs, no gradient).

Not covered: slime's ``--use-unbiased-kl`` (the DeepSeek-V3.2 importance-weighted estimate).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

__all__ = ["KLType", "LOW_VAR_KL_CLAMP", "kl_estimate"]

KLType = Literal["k1", "k2", "k3", "low_var_kl"]

LOW_VAR_KL_CLAMP = 10.0
"""``low_var_kl`` values are clamped to [-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP] (slime's bound)."""


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, kl_type: KLType) -> Tensor:
    """Per-token estimate of KL(policy || reference).

    Args:
        logprobs: [B, L] float32, natural log, the policy's logprob of each sampled token.
        ref_logprobs: [B, L] float32, the reference model's logprob of the same tokens.
        kl_type: ``k1``, ``k2``, ``k3`` or ``low_var_kl`` (see the module docstring).

    Returns:
        [B, L] float32; gradient flows to whichever input carries it. Callers mask it.

    Raises:
        ValueError: on a shape mismatch or an unknown ``kl_type``.
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"kl_estimate: logprobs {tuple(logprobs.shape)} != ref_logprobs {tuple(ref_logprobs.shape)}")
    log_ratio = logprobs.float() - ref_logprobs.float()  # [B, L], = -log r
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return log_ratio.square() / 2.0
    if kl_type in ("k3", "low_var_kl"):
        kl = (-log_ratio).exp() - 1.0 + log_ratio  # r - 1 - log r
        return kl.clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP) if kl_type == "low_var_kl" else kl
    raise ValueError(f"kl_estimate: kl_type={kl_type!r}, expected one of k1, k2, k3, low_var_kl")
