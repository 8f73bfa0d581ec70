"""Policy loss: PPO clipped surrogate with clip-higher and token-level truncated importance sampling.

Per token (shapes [B, L]: B samples, L next-token positions; legend in ``slime.train.batch``):

    ratio    = exp(logp - old_logp)
    loss_tok = -min(ratio * A, clip(ratio, 1 - eps_clip, 1 + eps_clip_high) * A)
    loss_tok = loss_tok * w,  w = clamp(exp(old_logp - rollout_logp), tis_clip_low, tis_clip)  (TIS)

Sources:
- PPO clipped surrogate: Schulman et al. 2017, arXiv 1707.06347, eq. 7.
- Clip-higher (a separate, larger upper clip ``eps_clip_high``): DAPO, Yu et al. 2025,
  arXiv 2503.14476, section 3.1.
- Truncated importance sampling (TIS): Yao et al. 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training" (fengyao.notion.site/off-policy-rl). ``old_logp`` comes from
  the trainer, ``rollout_logp`` from the inference engine; their ratio corrects the mismatch
  between the two. The weight is detached and truncated at ``tis_clip`` (and, our addition as in
  slime, floored at ``tis_clip_low``), then multiplied into the clipped per-token loss.

Aggregation (``loss_agg``):
- ``"seq_mean"`` (slime's default, its ``sum_of_sample_mean``): mean over each sample's masked
  tokens, then mean over samples. Every sample weighs the same whatever its length. A sample with
  no masked token contributes 0 but still counts in the sample denominator (as in slime, whose
  denominator is ``global_batch_size``).
- ``"token_mean"`` (slime's ``--calculate-per-token-loss``, DAPO's token-level loss): sum over all
  masked tokens divided by their number.
With gradient accumulation, pass the optimizer step's totals as ``loss_denominator`` so the sum of
the micro-batch losses equals the step's loss.

Not covered: dual-clip PPO (``eps_clip_c``), KL-to-reference and entropy-bonus terms, GSPO's
sequence-level ratio. Metrics are token means over masked tokens.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["LossAgg", "policy_loss"]

LossAgg = Literal["seq_mean", "token_mean"]


def _masked_mean(x: Tensor, mask: Tensor, num_tokens: Tensor) -> float:
    return float((x * mask).sum() / num_tokens.clamp_min(1.0))


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
    rollout_logprobs: Tensor | None = None,
    use_tis: bool = False,
    tis_clip: float = 2.0,
    tis_clip_low: float = 0.0,
    loss_agg: LossAgg = "seq_mean",
    loss_denominator: float | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped policy loss with optional clip-higher and TIS; see the module docstring.

    Args:
        logprobs: [B, L] float32, natural log, current policy (carries gradient).
        old_logprobs: [B, L] float32, the trainer's logprobs before this train step (no grad).
        advantages: [B, L] float32, the sample advantage broadcast over its response tokens.
        loss_mask: [B, L] float or bool, 1 = the token trains; 0 = prompt, padding, tool token,
            masked off-policy token or FAILED sample.
        eps_clip: lower clip; the ratio is clipped below at ``1 - eps_clip``.
        eps_clip_high: upper clip (``1 + eps_clip_high``); None = ``eps_clip`` (symmetric PPO).
        rollout_logprobs: [B, L] float32, the engine's logprobs; required when ``use_tis``.
        use_tis: multiply each token's loss by the truncated IS weight.
        tis_clip: upper truncation of the TIS weight.
        tis_clip_low: lower truncation of the TIS weight.
        loss_agg: ``"seq_mean"`` or ``"token_mean"``.
        loss_denominator: the number of samples (``seq_mean``) or masked tokens (``token_mean``) to
            divide by; None = this call's own count. Pass the optimizer step's total when
            accumulating gradients over micro-batches.
        entropy: [B, L] float32, nats, optional; reported as a metric only.

    Returns:
        loss: scalar tensor (gradient flows to ``logprobs``).
        metrics: floats, token means over masked tokens: ``pg_clipfrac`` (fraction of tokens where
            the clipped term is the active one), ``approx_kl`` (k3 estimate of KL(old || new):
            ``r - 1 - log r`` with ``r = exp(logp - old_logp)``), ``ratio_mean``, ``tis_mean`` and
            ``tis_clipfrac`` (when ``use_tis``), ``entropy`` (when given), and ``num_tokens``.

    Raises:
        ValueError: on shape mismatch, an unknown ``loss_agg``, or ``use_tis`` without
            ``rollout_logprobs``.
    """
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("advantages", advantages), ("loss_mask", loss_mask)):
        if t.shape != shape:
            raise ValueError(f"policy_loss: {name} shape {tuple(t.shape)} != logprobs shape {tuple(shape)}")
    if loss_agg not in ("seq_mean", "token_mean"):
        raise ValueError(f"policy_loss: loss_agg={loss_agg!r}, expected 'seq_mean' or 'token_mean'")
    if use_tis and (rollout_logprobs is None or rollout_logprobs.shape != shape):
        got = None if rollout_logprobs is None else tuple(rollout_logprobs.shape)
        raise ValueError(f"policy_loss: use_tis needs rollout_logprobs of shape {tuple(shape)}, got {got}")
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    mask = loss_mask.to(logprobs.dtype)  # [B, L]
    old_logprobs = old_logprobs.detach()

    log_ratio = logprobs - old_logprobs  # [B, L]
    ratio = log_ratio.exp()  # [B, L]
    pg_unclipped = -ratio * advantages  # [B, L]
    pg_clipped = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_high) * advantages  # [B, L]
    loss_tok = torch.maximum(pg_unclipped, pg_clipped)  # [B, L]; max of negatives = -min

    tis_weight = None
    if use_tis:
        assert rollout_logprobs is not None
        tis_raw = (old_logprobs - rollout_logprobs.detach()).exp()  # [B, L]
        tis_weight = tis_raw.clamp(min=tis_clip_low, max=tis_clip)  # [B, L]
        loss_tok = loss_tok * tis_weight

    loss_tok = loss_tok * mask  # [B, L]
    num_tokens = mask.sum()
    if loss_agg == "seq_mean":
        per_sample = loss_tok.sum(dim=-1) / mask.sum(dim=-1).clamp_min(1.0)  # [B]
        denom = float(shape[0]) if loss_denominator is None else loss_denominator
        loss = per_sample.sum() / max(denom, 1.0)
    else:
        denom = float(num_tokens) if loss_denominator is None else loss_denominator
        loss = loss_tok.sum() / max(denom, 1.0)

    with torch.no_grad():
        metrics = {
            "pg_clipfrac": _masked_mean((pg_clipped > pg_unclipped).float(), mask, num_tokens),
            "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, mask, num_tokens),
            "ratio_mean": _masked_mean(ratio, mask, num_tokens),
            "num_tokens": float(num_tokens),
        }
        if tis_weight is not None:
            metrics["tis_mean"] = _masked_mean(tis_weight, mask, num_tokens)
            metrics["tis_clipfrac"] = _masked_mean((tis_weight != tis_raw).float(), mask, num_tokens)
        if entropy is not None:
            metrics["entropy"] = _masked_mean(entropy, mask, num_tokens)
    return loss, metrics
