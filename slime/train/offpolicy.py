"""Off-policy corrections: per-token weights from the trainer-vs-rollout ratio.

Three policies can be involved in one train step: the *behaviour* policy that sampled a token (the
engine, possibly several versions ago; ``rollout_logp``), the *proximal* policy (the trainer's
weights before this train step; ``old_logp``, recomputed by the trainer) and the current policy
being optimised (``logp``). The PPO ratio ``exp(logp - old_logp)`` and its clip are always taken
around the proximal policy; what differs between the options below is how the remaining mismatch
``r = exp(old_logp - rollout_logp)`` weights each token's clipped loss. Every weight is detached.

At most one of them is active (``Config.validate`` enforces it); with none, the loss ignores the
mismatch, which is what slime does without ``--use-tis``.

1. TIS, truncated importance sampling (``--use-tis``): Yao et al. 2025, "Your Efficient RL
   Framework Secretly Brings You Off-Policy RL Training" (fengyao.notion.site/off-policy-rl).
   ``w = clamp(r, tis_clip_low, tis_clip)`` per token. The lower floor is slime's addition.
   ``--tis-level sequence`` / ``geometric`` truncate one ratio per sample instead, taken as MIS
   takes it below (slime's ``mis.py`` in ``tis_mode: truncate``).
2. MIS, masked importance sampling (``--mis-level``): Liu, Li et al. 2025, "When Speed Kills
   Stability: Demystifying RL Collapse from the Training-Inference Mismatch"
   (richardli.xyz/rl-collapse); slime's ``examples/train_infer_mismatch_helper/mis.py`` in
   ``mis_mode: mask``, and verl's rollout correction. ``w = rho * 1[lower <= rho <= upper]`` where
   rho is the ratio at one of three levels (log ratios summed over the sample's trained tokens):
   - ``token``:     rho_t = r_t                          (each token kept or masked alone)
   - ``sequence``:  rho   = exp(sum_t log r_t)           (product of ratios; the whole sample)
   - ``geometric``: rho   = exp(mean_t log r_t)          (geometric mean; the whole sample)
   A masked token keeps its place in the loss denominator (as in slime, whose reducer keeps the
   original ``loss_mask`` totals), so masking lowers the step's loss rather than re-weighting the
   rest. As slime does, the sequence/geometric log ratio is clamped to [-20, 20] before ``exp``.
   Not covered: slime's ``mis_mode`` ``truncate``/``clip`` (= TIS) and ``mis_veto_threshold``.
3. Decoupled PPO (``--use-decoupled-ppo``): Hilton et al. 2021, "Batch size-invariance for policy
   optimization" (arXiv 2110.00603), as AReaL uses it (Fu et al. 2025, arXiv 2505.24298,
   ``ppo_actor_loss_fn``): the clip is around the proximal policy and the clipped loss is
   weighted by the behaviour importance ratio ``w = r = exp(prox_logp - behav_logp)``. With
   ``behav_imp_weight_cap`` set, tokens whose ``w`` exceeds the cap are filtered out (``w = 0``;
   AReaL masks rather than truncates), and keep their place in the denominator as in AReaL.
   Our trainer always recomputes ``old_logp``, so the proximal policy is exactly the policy
   before this train step (AReaL's ``recompute_logprob``). Not covered: AReaL's approximated
   proximal logprobs (``prox_logp_method`` loglinear/linear) and M2PO filtering.

Options 1 and 3 differ only in what they do with large ``r`` (truncate vs. keep or filter), and
token-level MIS with ``lower = 0`` equals decoupled PPO with ``cap = upper``.

Example (one sample, 3 trained tokens, log r = [0.0, ln 3, ln 0.25], tis_clip 2, MIS [0.5, 2]):
    TIS:              w = [1, 2, 0.25]
    MIS token:        w = [1, 0, 0]                    (3 > 2 and 0.25 < 0.5 are masked)
    MIS sequence:     rho = 1 * 3 * 0.25 = 0.75        -> w = [0.75, 0.75, 0.75]
    MIS geometric:    rho = 0.75 ** (1/3) = 0.9086     -> w = [0.9086] * 3
    decoupled cap 2:  w = [1, 0, 0.25]
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["MISLevel", "MIS_LOG_RATIO_BOUND", "tis_weights", "mis_weights", "decoupled_weights"]

MISLevel = Literal["token", "sequence", "geometric"]

MIS_LOG_RATIO_BOUND = 20.0
"""Sequence/geometric log ratios are clamped to [-20, 20] before ``exp`` (slime's SAFETY_BOUND)."""


def _token_mean(x: Tensor, mask: Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp_min(1.0))


def _check(old_logprobs: Tensor, rollout_logprobs: Tensor, loss_mask: Tensor) -> Tensor:
    if not (old_logprobs.shape == rollout_logprobs.shape == loss_mask.shape):
        raise ValueError(
            f"off-policy weights: old_logprobs {tuple(old_logprobs.shape)}, rollout_logprobs "
            f"{tuple(rollout_logprobs.shape)} and loss_mask {tuple(loss_mask.shape)} must be the same [B, L]"
        )
    return (old_logprobs.detach().float() - rollout_logprobs.detach().float()) * loss_mask  # [B, L], 0 off mask


def _log_rho(log_r: Tensor, mask: Tensor, level: str) -> Tensor:
    """[B, L] log ratio at ``level``: per token, or each sample's sum / mean broadcast to its tokens."""
    if level == "token":
        return log_r
    if level in ("sequence", "geometric"):
        seq = log_r.sum(dim=-1, keepdim=True)  # [B, 1]
        if level == "geometric":
            seq = seq / mask.sum(dim=-1, keepdim=True).clamp_min(1.0)
        return seq.clamp(-MIS_LOG_RATIO_BOUND, MIS_LOG_RATIO_BOUND).expand_as(log_r)  # [B, L]
    raise ValueError(f"importance weights: level={level!r}, expected token, sequence or geometric")


def tis_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    tis_clip: float,
    tis_clip_low: float = 0.0,
    level: MISLevel = "token",
) -> tuple[Tensor, dict[str, float]]:
    """Truncated IS weights ``clamp(rho, tis_clip_low, tis_clip)``, rho = ``exp(old - rollout)`` at ``level``.

    Args:
        old_logprobs: [B, L] float32, the trainer's logprobs before the update (proximal).
        rollout_logprobs: [B, L] float32, the engine's logprobs (behaviour).
        loss_mask: [B, L] float, 1 = token trains.
        tis_clip / tis_clip_low: upper / lower truncation.
        level: ``token`` (each token's ratio), ``sequence`` (one ratio per sample: the product
            over its trained tokens) or ``geometric`` (their geometric mean), as ``mis_weights``.

    Returns:
        weights: [B, L] float32, detached; 0 where ``loss_mask`` is 0.
        metrics: ``tis_mean`` (mean weight) and ``tis_clipfrac`` (fraction truncated), token
            means over ``loss_mask``.

    Raises:
        ValueError: on a shape mismatch or an unknown level.
    """
    mask = loss_mask.float()
    raw = _log_rho(_check(old_logprobs, rollout_logprobs, mask), mask, level).exp()  # [B, L]
    weights = raw.clamp(min=tis_clip_low, max=tis_clip) * mask
    return weights, {
        "tis_mean": _token_mean(weights, mask),
        "tis_clipfrac": _token_mean((weights != raw * mask).float(), mask),
    }


def mis_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    level: MISLevel,
    lower_bound: float,
    upper_bound: float,
) -> tuple[Tensor, dict[str, float]]:
    """Masked IS weights ``rho * 1[lower_bound <= rho <= upper_bound]`` at token/sequence/geometric level.

    Args:
        old_logprobs / rollout_logprobs / loss_mask: [B, L], as in ``tis_weights``.
        level: ``token``, ``sequence`` (product over the sample's trained tokens) or
            ``geometric`` (geometric mean over them).
        lower_bound / upper_bound: rho outside [lower_bound, upper_bound] masks the token
            (token level) or every token of the sample (sequence/geometric levels).

    Returns:
        weights: [B, L] float32, detached; 0 where masked or where ``loss_mask`` is 0.
        metrics: token means over ``loss_mask``: ``mis_rho_mean`` (rho before masking),
            ``mis_mask_frac_low`` / ``mis_mask_frac_high`` (masked below / above the bounds),
            ``mis_mean`` (the weight after masking).

    Raises:
        ValueError: on a shape mismatch or an unknown level.
    """
    mask = loss_mask.float()
    rho = _log_rho(_check(old_logprobs, rollout_logprobs, mask), mask, level).exp()  # [B, L]
    low, high = (rho < lower_bound).float(), (rho > upper_bound).float()
    weights = rho * (1.0 - low) * (1.0 - high) * mask
    metrics = {
        "mis_rho_mean": _token_mean(rho, mask),
        "mis_mask_frac_low": _token_mean(low, mask),
        "mis_mask_frac_high": _token_mean(high, mask),
        "mis_mean": _token_mean(weights, mask),
    }
    return weights, metrics


def decoupled_weights(
    prox_logprobs: Tensor, behav_logprobs: Tensor, loss_mask: Tensor, *, behav_imp_weight_cap: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Decoupled-PPO behaviour weights ``exp(prox - behav)``, filtered (set to 0) above the cap.

    Args:
        prox_logprobs: [B, L] float32, the trainer's logprobs before this train step.
        behav_logprobs: [B, L] float32, the engine's logprobs of the sampled tokens.
        loss_mask: [B, L] float, 1 = token trains.
        behav_imp_weight_cap: None = no filter; otherwise tokens with weight > cap get 0.

    Returns:
        weights: [B, L] float32, detached; 0 where filtered or ``loss_mask`` is 0.
        metrics: token means over ``loss_mask``: ``behav_imp_weight_mean`` (before the filter),
            ``behav_mask_frac`` (filtered by the cap).
    """
    mask = loss_mask.float()
    raw = _check(prox_logprobs, behav_logprobs, mask).exp()  # [B, L]
    over = (raw > behav_imp_weight_cap).float() if behav_imp_weight_cap is not None else torch.zeros_like(raw)
    weights = raw * (1.0 - over) * mask
    return weights, {"behav_imp_weight_mean": _token_mean(raw, mask), "behav_mask_frac": _token_mean(over, mask)}
