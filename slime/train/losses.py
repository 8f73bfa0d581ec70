"""Policy loss: PPO clipped surrogate with clip-higher, dual clip, GSPO's sequence ratio, per-token
off-policy weights and an entropy bonus; plus the aggregation every loss term shares.

Per token (shapes [B, L]: B samples, L next-token positions; legend in ``slime.train.batch``):

    ratio    = exp(logp - old_logp)                                  (token level, PPO)
             = exp(mean_t (logp - old_logp)) for every token of a sample     (sequence level, GSPO)
    loss_tok = max(-ratio * A, -clip(ratio, 1 - eps_clip, 1 + eps_clip_high) * A)
    loss_tok = min(loss_tok, -eps_clip_c * A)   where A < 0          (dual clip)
    loss_tok = loss_tok * w                                           (TIS / MIS / decoupled weight)
    loss     = agg(loss_tok) - entropy_coef * agg(entropy)

Sources and where we depart:
- PPO clipped surrogate: Schulman et al. 2017, arXiv 1707.06347, eq. 7.
- Clip-higher (``eps_clip_high``): DAPO, Yu et al. 2025, arXiv 2503.14476, section 3.1.
- Dual clip (``eps_clip_c``): Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep
  Reinforcement Learning", arXiv 1912.09729 (dual-clip PPO): for A < 0 the clipped objective is bounded
  below by ``c * A`` (c > 1), i.e. the loss is capped at ``-c * A``, so a huge ratio on a bad
  token cannot produce an unbounded update. Applied before the off-policy weight, as slime
  (``compute_policy_loss``) and AReaL do.
- GSPO (``ratio_level="sequence"``): Zheng et al. 2025, "Group Sequence Policy Optimization",
  arXiv 2507.18071: one length-normalised ratio per sample, clipped at the sequence level
  (the paper uses eps 3e-4 / 4e-4; set ``--eps-clip`` / ``--eps-clip-high`` accordingly). The
  gradient flows through every token's logprob. With ``seq_mean`` aggregation this is the paper's
  per-sample objective exactly; with ``token_mean`` each sample is weighted by its length (slime
  allows the same combination). Not covered: GSPO-token.
- Off-policy weights ``w`` (TIS, MIS, decoupled PPO): see ``slime.train.offpolicy``.
- Entropy bonus (``entropy_coef``): slime's ``loss = pg_loss - entropy_coef * entropy_loss``, with
  the entropy aggregated like the loss; its gradient flows only when ``entropy_coef != 0``.

Aggregation (``loss_agg``, shared by every loss term through ``aggregate``):
- ``"seq_mean"`` (slime's default, its ``sum_of_sample_mean``): mean over each sample's masked
  tokens, then mean over the samples that have one. A sample with no masked token (e.g. every token
  masked as over-stale) contributes 0 and is out of the sample denominator too (``loss_denominator``):
  slime divides by ``global_batch_size``, which up-weights nothing only while no sample is fully
  masked; under APRIL's staleness mask ~9 % were (issue 30), scaling every other sample's weight down.
- ``"token_mean"`` (slime's ``--calculate-per-token-loss``, DAPO's token-level loss): sum over all
  masked tokens divided by their number.
With gradient accumulation, pass the optimizer step's totals as ``loss_denominator`` so the sum of
the micro-batch losses equals the step's loss.

Not covered: Dr. GRPO's constant (generation-budget) denominator; CISPO; OPSM. Metrics are token
means over masked tokens.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["LossAgg", "RatioLevel", "aggregate", "loss_denominator", "policy_loss", "sft_loss"]

LossAgg = Literal["seq_mean", "token_mean"]
RatioLevel = Literal["token", "sequence"]


def _masked_mean(x: Tensor, mask: Tensor, num_tokens: Tensor) -> float:
    return float((x * mask).sum() / num_tokens.clamp_min(1.0))


def loss_denominator(mask: Tensor, loss_agg: LossAgg) -> float:
    """An optimizer step's denominator from its loss mask [S, L]: the samples with at least one masked token
    (``seq_mean``; a fully masked sample is in no denominator) or the masked tokens (``token_mean``).

    Example: masks [[1, 1], [0, 0], [1, 0]] -> seq_mean 2.0, token_mean 3.0.
    """
    if loss_agg == "seq_mean":
        return float((mask.sum(dim=-1) > 0).sum())
    return float(mask.sum())


def aggregate(x: Tensor, mask: Tensor, *, loss_agg: LossAgg, loss_denominator: float | None = None) -> Tensor:
    """Reduce per-token values [B, L] to a scalar, the way every loss term of a step is reduced.

    Args:
        x: [B, L] float, per-token values (may carry gradient).
        mask: [B, L] float, 1 = the token counts.
        loss_agg: ``"seq_mean"`` or ``"token_mean"`` (module docstring).
        loss_denominator: samples (``seq_mean``) or masked tokens (``token_mean``) to divide by;
            None = this call's own count.

    Example (two samples, masks [1, 1, 0] and [1, 0, 0], x = [[1, 3, 9], [4, 9, 9]]):
        seq_mean = ((1 + 3) / 2 + 4 / 1) / 2 = 3.0;  token_mean = (1 + 3 + 4) / 3 = 2.6667
    """
    x = x * mask  # zero off the mask before any sum: padding and masked tokens never reach the loss
    if loss_agg == "seq_mean":
        # a sample with no masked token gives 0, not 0/0, and is out of the sample denominator
        per_sample = x.sum(dim=-1) / mask.sum(dim=-1).clamp_min(1.0)  # [B]
        denom = float((mask.sum(dim=-1) > 0).sum()) if loss_denominator is None else loss_denominator
        return per_sample.sum() / max(denom, 1.0)
    if loss_agg == "token_mean":
        # with accumulation: the step's total, so the micro-batch losses sum to the step's loss
        denom = float(mask.sum()) if loss_denominator is None else loss_denominator
        return x.sum() / max(denom, 1.0)
    raise ValueError(f"aggregate: loss_agg={loss_agg!r}, expected 'seq_mean' or 'token_mean'")


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
    ratio_level: RatioLevel = "token",
    is_weights: Tensor | None = None,
    loss_agg: LossAgg = "seq_mean",
    loss_denominator: float | None = None,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy loss; see the module docstring for every option.

    Args:
        logprobs: [B, L] float32, natural log, current policy (carries gradient).
        old_logprobs: [B, L] float32, the trainer's logprobs before this train step (no grad).
        advantages: [B, L] float32, per-token advantages.
        loss_mask: [B, L] float or bool, 1 = the token trains; 0 = prompt, padding, tool token,
            masked off-policy token or FAILED sample.
        eps_clip: lower clip; the ratio is clipped below at ``1 - eps_clip``.
        eps_clip_high: upper clip (``1 + eps_clip_high``); None = ``eps_clip`` (symmetric PPO).
        eps_clip_c: dual-clip constant c > 1 for A < 0; None = off.
        ratio_level: ``"token"`` (PPO) or ``"sequence"`` (GSPO).
        is_weights: [B, L] float32, per-token off-policy weights (``slime.train.offpolicy``); None = 1.
        loss_agg: ``"seq_mean"`` or ``"token_mean"``.
        loss_denominator: see ``aggregate``; pass the optimizer step's total with accumulation.
        entropy: [B, L] float32, nats; reported, and subtracted (with gradient) when ``entropy_coef`` != 0.
        entropy_coef: weight of the entropy bonus.

    Returns:
        loss: scalar tensor (gradient flows to ``logprobs`` and, with the bonus, ``entropy``).
        metrics: floats, token means over masked tokens: ``pg_clipfrac`` (the clipped term is the
            active one), ``approx_kl`` (k3 estimate of KL(old || new) per token: ``r - 1 - log r``
            with ``r = exp(logp - old_logp)``), ``ratio_mean`` (the ratio the loss used),
            ``dual_clipfrac`` (with ``eps_clip_c``), ``entropy`` (when given), ``pg_loss`` (the
            aggregated clipped term) and ``num_tokens``.

    Raises:
        ValueError: shape mismatch, unknown ``loss_agg`` / ``ratio_level``, ``entropy_coef`` != 0 without ``entropy``.
    """
    _check_policy_inputs(logprobs, old_logprobs, advantages, loss_mask, is_weights, loss_agg, entropy, entropy_coef)
    mask = loss_mask.to(logprobs.dtype)  # [B, L]
    log_ratio = (logprobs - old_logprobs.detach()) * mask  # [B, L]; 0 off mask so exp stays finite
    ratio = _ratio(log_ratio, mask, ratio_level)  # [B, L]
    loss_tok, clipped, dual_active = _clipped_token_loss(ratio, advantages, eps_clip, eps_clip_high, eps_clip_c)
    if is_weights is not None:
        # the weight scales the gradient but takes none; applied after the dual clip, as slime and AReaL do
        loss_tok = loss_tok * is_weights.detach()
    pg_loss = aggregate(loss_tok, mask, loss_agg=loss_agg, loss_denominator=loss_denominator)
    loss = pg_loss
    if entropy_coef != 0.0:
        assert entropy is not None
        loss = loss - entropy_coef * aggregate(entropy, mask, loss_agg=loss_agg, loss_denominator=loss_denominator)
    return loss, _policy_metrics(log_ratio, ratio, mask, clipped, dual_active, entropy, pg_loss)


def _clipped_token_loss(
    ratio: Tensor, advantages: Tensor, eps_clip: float, eps_clip_high: float | None, eps_clip_c: float | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The per-token clipped surrogate [B, L] (clipped to ``[1 - eps_clip, 1 + eps_clip_high]``, None =
    ``eps_clip``; dual-clipped with ``eps_clip_c``), where the clipped term is the active one [B, L] bool,
    and where the dual clip is ([B, L] bool; None without it)."""
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    pg_unclipped = -ratio * advantages  # [B, L]
    # clip-higher: the upper bound may be wider than the lower (DAPO)
    pg_clipped = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_high) * advantages  # [B, L]
    loss_tok = torch.maximum(pg_unclipped, pg_clipped)  # [B, L]; max of negatives = -min
    clipped = pg_clipped > pg_unclipped  # a comparison: no gradient
    dual_active = None
    if eps_clip_c is not None:
        pg_dual = -eps_clip_c * advantages  # [B, L]
        # A < 0 only: for A > 0 the upper clip already bounds the loss; the cap is -c * A
        dual_active = (advantages < 0) & (pg_dual < loss_tok)
        loss_tok = torch.where(dual_active, pg_dual, loss_tok)
    return loss_tok, clipped, dual_active


@torch.no_grad()
def _policy_metrics(
    log_ratio: Tensor,
    ratio: Tensor,
    mask: Tensor,
    clipped: Tensor,
    dual_active: Tensor | None,
    entropy: Tensor | None,
    pg_loss: Tensor,
) -> dict[str, float]:
    """``policy_loss``'s metrics (its docstring), token means over ``mask``."""
    num_tokens = mask.sum()
    token_ratio = log_ratio.exp()  # per token even with GSPO: approx_kl is a token-level estimate
    metrics = {
        "pg_clipfrac": _masked_mean(clipped.float(), mask, num_tokens),
        "approx_kl": _masked_mean(token_ratio - 1.0 - log_ratio, mask, num_tokens),
        "ratio_mean": _masked_mean(ratio, mask, num_tokens),
        "pg_loss": float(pg_loss.detach()),
        "num_tokens": float(num_tokens),
    }
    if dual_active is not None:
        metrics["dual_clipfrac"] = _masked_mean(dual_active.float(), mask, num_tokens)
    if entropy is not None:
        metrics["entropy"] = _masked_mean(entropy.detach(), mask, num_tokens)
    return metrics


def _check_policy_inputs(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    is_weights: Tensor | None,
    loss_agg: LossAgg,
    entropy: Tensor | None,
    entropy_coef: float,
) -> None:
    """``policy_loss``'s ValueErrors: shapes, ``loss_agg``, the entropy the bonus needs."""
    shape = logprobs.shape
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("advantages", advantages),
        ("loss_mask", loss_mask),
        ("is_weights", is_weights),
    ):
        if t is not None and t.shape != shape:
            raise ValueError(f"policy_loss: {name} shape {tuple(t.shape)} != logprobs shape {tuple(shape)}")
    if loss_agg not in ("seq_mean", "token_mean"):
        raise ValueError(f"policy_loss: loss_agg={loss_agg!r}, expected 'seq_mean' or 'token_mean'")
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("policy_loss: entropy_coef != 0 needs the entropy tensor")


def _ratio(log_ratio: Tensor, mask: Tensor, ratio_level: RatioLevel) -> Tensor:
    """The importance ratio [B, L] from the masked log-ratio [B, L]: per token (PPO), or one
    length-normalised ratio per sample broadcast over its tokens (GSPO)."""
    if ratio_level == "token":
        return log_ratio.exp()  # [B, L]
    if ratio_level == "sequence":
        # the mean log-ratio, not the sum: a long sample's ratio does not grow with its length
        seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp_min(1.0)  # [B, 1]
        # one ratio for the sample's tokens; the gradient still flows through each token's logprob
        return seq_log_ratio.exp().expand_as(log_ratio)  # [B, L]
    raise ValueError(f"policy_loss: ratio_level={ratio_level!r}, expected 'token' or 'sequence'")


def sft_loss(
    logprobs: Tensor, loss_mask: Tensor, *, loss_agg: LossAgg = "token_mean", loss_denominator: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Supervised fine-tuning loss: the negative log-likelihood of the masked tokens, aggregated.

    ``loss = aggregate(-logprobs, loss_mask)``: with ``token_mean`` (``--calculate-per-token-loss``,
    THUDM/slime's SFT recipe) the mean NLL per trained token of the optimizer step, which is the
    Hugging Face causal-LM loss with labels -100 off the mask; with ``seq_mean`` each sample's mean
    NLL, averaged over samples.

    Args:
        logprobs: [B, L] float32, natural log, the policy's logprob of each next token (carries
            gradient; temperature 1 for SFT: pass ``rollout_temperature`` 1).
        loss_mask: [B, L] float or bool, 1 = the next token trains (assistant / response tokens).
        loss_agg: ``"token_mean"`` or ``"seq_mean"``.
        loss_denominator: see ``aggregate``; the optimizer step's total with accumulation.

    Returns:
        loss: scalar tensor. metrics: ``nll`` (token mean of -logprob over masked tokens) and
        ``num_tokens``.

    Example: logprobs [[-1, -2, -3]], mask [[0, 1, 1]] -> token_mean loss (2 + 3) / 2 = 2.5.

    Raises:
        ValueError: shapes differ.
    """
    if loss_mask.shape != logprobs.shape:
        raise ValueError(
            f"sft_loss: loss_mask shape {tuple(loss_mask.shape)} != logprobs shape {tuple(logprobs.shape)}"
        )
    mask = loss_mask.to(logprobs.dtype)
    num_tokens = mask.sum()
    loss = aggregate(-logprobs, mask, loss_agg=loss_agg, loss_denominator=loss_denominator)
    with torch.no_grad():
        metrics = {"nll": _masked_mean(-logprobs.detach(), mask, num_tokens), "num_tokens": float(num_tokens)}
    return loss, metrics
