"""Advantage estimators (slime's ``--advantage-estimator``): GRPO, GSPO, REINFORCE++, REINFORCE++-baseline, PPO (GAE).

Two stages. ``sample_scores`` turns the reward of each sample into a score using its group (the
samples of one prompt); ``slime.train.batch`` calls it and broadcasts the score over the sample's
response tokens. For GRPO and GSPO that broadcast is the advantage. The other estimators need what
only the trainer has (pre-update logprobs, reference logprobs, critic values), so
``token_advantages`` finishes them inside the train step.

GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, section 4.1.2, "outcome supervision"):
reward minus the group mean, divided by the group std. Dr. GRPO (Liu et al. 2025, arXiv 2503.20783)
drops the division (``normalize_by_std=False``, slime's ``--disable-grpo-std-normalization``).
- std is the *unbiased* (``N - 1``) group std, as slime's ``rewards.std(dim=-1)``; ``eps`` is added
  to the std, so an all-equal group gets 0 rather than NaN.
- Invalid samples (FAILED) are left out of the group's mean and std and get 0. A group with fewer
  than 2 valid samples has std 0 and every advantage 0.
GSPO (Zheng et al. 2025, arXiv 2507.18071) uses the GRPO advantage; its difference is the ratio
(``slime.train.losses``).

REINFORCE++ (Hu et al. 2025, arXiv 2501.03262): per-token rewards ``r_t = -kl_coef *
kl_t`` plus the sample reward at its last trained token; the advantage is the discounted return
``G_t = r_t + gamma * G_{t+1}`` over the response, then whitened over every trained token of the
batch. REINFORCE++-baseline (the paper's group-baseline variant; slime's
``get_reinforce_plus_plus_baseline_advantages``): reward minus the group mean, minus
``kl_coef * kl_t`` per token (not discounted), then whitened.

PPO with a critic (``ppo``, slime's name; ``gae`` is accepted as an alias): GAE (Schulman et al.
2016, arXiv 1506.02438) over the response with ``gamma`` and ``lambd``, on the same
per-token rewards; the value after the last response token is 0. Returns = advantages + values
(before any whitening) are the critic's targets.

Where we depart from slime:
- slime whitens only under ``--normalize-advantages``; we always whiten REINFORCE++ and
  REINFORCE++-baseline, as the paper does, and ``--normalize-advantages`` adds it to the others.
- slime puts the KL penalty on every response token (all estimators) and the PPO reward on the
  last response token; we put both on trained tokens only (the reward on the last one). They agree
  for single-turn samples; for tool tokens the trainer's logprob is not the policy's action.

Whitening is slime's ``distributed_masked_whiten``: ``(x - mean) / sqrt(var + 1e-8)`` with the
unbiased (``N - 1``) variance over the trained tokens of the whole train step.

Example (one group of 4, rewards 1, 0, 0, 1)::

    GRPO:        mean 0.5, centred [0.5, -0.5, -0.5, 0.5], unbiased std 0.57735
                 -> [0.866, -0.866, -0.866, 0.866]   (Dr. GRPO: [0.5, -0.5, -0.5, 0.5])
    REINFORCE++, one sample of 3 trained tokens, reward 1, gamma 0.5, no KL:
                 returns [0.25, 0.5, 1.0] before whitening
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "AdvantageEstimator",
    "WHITEN_EPS",
    "grpo_advantages",
    "sample_scores",
    "masked_whiten",
    "discounted_returns",
    "gae",
    "token_advantages",
]

AdvantageEstimator = Literal["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo", "gae"]
GROUP_NORMALISED = ("grpo", "gspo")
CRITIC_ESTIMATORS = ("ppo", "gae")
ALWAYS_WHITENED = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")

WHITEN_EPS = 1e-8
"""Added to the variance in ``masked_whiten``."""


def grpo_advantages(
    rewards: Tensor,
    *,
    normalize_by_std: bool = True,
    eps: float = 1e-6,
    valid_mask: Tensor | None = None,
) -> Tensor:
    """Group-relative advantages (GRPO; Dr. GRPO when ``normalize_by_std`` is False).

    Args:
        rewards: [num_groups, n] float, one scalar reward per sample; rows are groups. Values
            at invalid positions are ignored (they may be NaN).
        normalize_by_std: divide the centred rewards by (unbiased group std + ``eps``).
        eps: added to the std; unit of the reward.
        valid_mask: [num_groups, n] bool, True = the sample takes part in its group's statistics.
            None = every sample is valid. Ragged groups are padded to ``n`` with False.

    Returns:
        [num_groups, n] float32, the advantage of each sample; 0.0 at invalid positions.

    Raises:
        ValueError: when ``rewards`` is not 2-D, or ``valid_mask`` has another shape.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_groups, n], got shape {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float32)
    if valid_mask is None:
        valid_mask = torch.ones_like(rewards, dtype=torch.bool)
    if valid_mask.shape != rewards.shape:
        raise ValueError(f"valid_mask shape {tuple(valid_mask.shape)} != rewards shape {tuple(rewards.shape)}")
    valid = valid_mask.to(torch.float32)  # [G, n]
    rewards = torch.where(valid_mask, rewards, torch.zeros_like(rewards))  # NaN at invalid -> 0
    count = valid.sum(dim=-1, keepdim=True)  # [G, 1]
    mean = rewards.sum(dim=-1, keepdim=True) / count.clamp_min(1.0)  # [G, 1]
    centred = (rewards - mean) * valid  # [G, n]
    if not normalize_by_std:
        return centred
    var = centred.square().sum(dim=-1, keepdim=True) / (count - 1.0).clamp_min(1.0)  # [G, 1], unbiased
    return centred / (var.sqrt() + eps)


def sample_scores(
    rewards: Tensor, valid_mask: Tensor, *, estimator: AdvantageEstimator, normalize_by_std: bool = True
) -> Tensor:
    """The per-sample score each estimator starts from ([num_groups, n] in, same shape out).

    ``grpo``/``gspo``: GRPO advantages (final). ``reinforce_plus_plus_baseline``: reward minus the
    group mean. ``reinforce_plus_plus``/``ppo``/``gae``: the raw reward. 0 at invalid samples.
    """
    if estimator in GROUP_NORMALISED:
        return grpo_advantages(rewards, normalize_by_std=normalize_by_std, valid_mask=valid_mask)
    if estimator == "reinforce_plus_plus_baseline":
        return grpo_advantages(rewards, normalize_by_std=False, valid_mask=valid_mask)
    if estimator in ("reinforce_plus_plus", *CRITIC_ESTIMATORS):
        return torch.where(valid_mask, rewards.to(torch.float32), torch.zeros_like(rewards, dtype=torch.float32))
    raise ValueError(f"unknown advantage estimator {estimator!r}")


def masked_whiten(x: Tensor, mask: Tensor) -> Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` over the masked entries (unbiased variance); 0 off the mask.

    Example: x = [1, 2, 3, 99] with mask [1, 1, 1, 0] -> mean 2, var (1 + 0 + 1) / 2 = 1 -> [-1, 0, 1, 0].
    """
    mask = mask.float()
    count = mask.sum()
    mean = (x * mask).sum() / count.clamp_min(1.0)
    var = ((x - mean).square() * mask).sum() / (count - 1.0).clamp_min(1.0)
    return (x - mean) * torch.rsqrt(var + WHITEN_EPS) * mask


def _continues(response_mask: Tensor) -> Tensor:
    """[B, L] 1 where the next position is still in the response (the recursion carries over)."""
    nxt = torch.zeros_like(response_mask)
    nxt[:, :-1] = response_mask[:, 1:]
    return nxt


def discounted_returns(rewards: Tensor, response_mask: Tensor, *, gamma: float) -> Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` along each row's response positions; 0 elsewhere.

    Args:
        rewards: [B, L] float32 per-token rewards (0 off the response).
        response_mask: [B, L] float, 1 at positions that predict a response token (contiguous).
        gamma: discount per token.
    """
    cont = _continues(response_mask)
    out = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * cont[:, t] * running
        out[:, t] = running * response_mask[:, t]
    return out


def gae(rewards: Tensor, values: Tensor, response_mask: Tensor, *, gamma: float, lambd: float) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over each row's response; value after the last token = 0.

    ``delta_t = r_t + gamma * V_{t+1} - V_t``;  ``A_t = delta_t + gamma * lambd * A_{t+1}``.

    Args:
        rewards / values: [B, L] float32, per-token rewards and critic values (old, no grad).
        response_mask: [B, L] float, 1 at positions predicting a response token (contiguous).
        gamma / lambd: discount and GAE lambda.

    Returns:
        advantages, returns: [B, L] float32 (returns = advantages + values), 0 off the response.
    """
    cont = _continues(response_mask)
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:]
    deltas = rewards + gamma * cont * next_values - values  # [B, L]
    adv = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = deltas[:, t] + gamma * lambd * cont[:, t] * running
        adv[:, t] = running * response_mask[:, t]
    return adv, (adv + values) * response_mask


def _terminal_rewards(scores: Tensor, loss_mask: Tensor) -> Tensor:
    """[B, L] zeros with each sample's score at its last trained position (none if no such token)."""
    num_positions = loss_mask.shape[1]
    has_token = loss_mask.sum(dim=-1) > 0  # [B]
    last = num_positions - 1 - loss_mask.flip(-1).argmax(dim=-1)  # [B], first max of the flipped row
    out = torch.zeros_like(loss_mask, dtype=torch.float32)
    rows = torch.arange(loss_mask.shape[0])[has_token]
    out[rows, last[has_token]] = scores[has_token].float()
    return out


def token_advantages(
    estimator: AdvantageEstimator,
    *,
    scores: Tensor,
    loss_mask: Tensor,
    response_mask: Tensor,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lambd: float = 1.0,
    normalize_advantages: bool = False,
    opd_penalty: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token advantages (and critic returns) of a whole train step.

    Args:
        estimator: see ``AdvantageEstimator``.
        scores: [B] float32, ``sample_scores`` of each sample.
        loss_mask: [B, L] float, 1 = trained token (whitening statistics, reward and KL positions).
        response_mask: [B, L] float, 1 = position predicting a response token (discounting axis).
        kl: [B, L] per-token KL to the reference (``slime.train.kl``), used with ``kl_coef``;
            ignored by GRPO/GSPO, as in slime.
        kl_coef: slime's ``--kl-coef`` (KL folded into the rewards).
        values: [B, L] critic values before the update; required by ``ppo``/``gae``.
        gamma / lambd: slime's ``--gamma`` / ``--lambd``.
        normalize_advantages: whiten GRPO/GSPO/PPO advantages too (REINFORCE++ always is).
        opd_penalty: [B, L] float32, ``opd_kl_coef * kl_t`` on trained tokens (``slime.train.opd``),
            subtracted from the advantage after the estimator and before whitening (THUDM/slime's
            order); the critic's returns do not include it. None = no distillation term.

    Returns:
        advantages: [B, L] float32, 0 off the response. returns: [B, L] critic targets for
        ``ppo``/``gae``, else None.

    Raises:
        ValueError: an unknown estimator, or ``ppo``/``gae`` without ``values``.
    """
    mask = loss_mask.float()
    response = response_mask.float()
    penalty = kl_coef * kl.detach() * mask if (kl is not None and kl_coef != 0.0) else torch.zeros_like(mask)
    adv, returns = _estimate(estimator, scores, mask, response, penalty, values, gamma=gamma, lambd=lambd)
    if opd_penalty is not None:
        adv = adv - opd_penalty.detach().float() * mask
    if estimator in ALWAYS_WHITENED or normalize_advantages:
        adv = masked_whiten(adv, mask)
    return adv, returns


def _estimate(
    estimator: AdvantageEstimator,
    scores: Tensor,
    mask: Tensor,
    response: Tensor,
    penalty: Tensor,
    values: Tensor | None,
    *,
    gamma: float,
    lambd: float,
) -> tuple[Tensor, Tensor | None]:
    """``token_advantages``' estimator step, before the OPD term and whitening: advantages [B, L] and,
    for ``ppo``/``gae``, the critic's returns; ``penalty`` [B, L] is the KL folded into the rewards."""
    if estimator in GROUP_NORMALISED:
        return scores[:, None].float() * response, None
    if estimator == "reinforce_plus_plus_baseline":
        return (scores[:, None].float() - penalty) * response, None
    if estimator == "reinforce_plus_plus":
        return discounted_returns(_terminal_rewards(scores, mask) - penalty, response, gamma=gamma), None
    if estimator in CRITIC_ESTIMATORS:
        if values is None:
            raise ValueError(f"advantage estimator {estimator!r} needs critic values")
        return gae(
            _terminal_rewards(scores, mask) - penalty,
            values.detach().float() * response,
            response,
            gamma=gamma,
            lambd=lambd,
        )
    raise ValueError(f"unknown advantage estimator {estimator!r}")
