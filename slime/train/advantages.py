"""Advantage estimators: group-relative (GRPO) advantages from one scalar reward per sample.

GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, section 4.1.2, "outcome supervision"):
each sample's advantage is its reward minus the mean reward of its group (the samples of one
prompt), divided by the group's standard deviation. Dr. GRPO (Liu et al. 2025, "Understanding
R1-Zero-Like Training", arXiv 2503.20783) drops the division by the std, which biases updates
towards groups whose rewards barely differ; ``normalize_by_std=False`` gives that variant.

Every response token of a sample carries the sample's advantage (outcome reward, no per-token
credit assignment); ``slime.train.batch`` does the broadcast.

Our choices, and where they differ from the paper:
- std is the *unbiased* (Bessel-corrected, ``N - 1``) group std, as ``torch.std`` computes by
  default and as slime does (``rewards.std(dim=-1)``); the paper does not say which.
- ``eps`` is added to the std (not to the variance), as slime does, so an all-equal group gets
  advantage 0 rather than NaN.
- Invalid samples (``valid_mask`` False, e.g. FAILED ones) are left out of the group's mean and
  std and get advantage 0. A group with fewer than 2 valid samples has std 0 and every advantage 0.

Example (one group of 4, rewards 1, 0, 0, 1)::

    mean = 0.5; centred = [0.5, -0.5, -0.5, 0.5]
    unbiased std = sqrt((4 * 0.25) / 3) = 0.57735
    advantages   = [0.866, -0.866, -0.866, 0.866]      (normalize_by_std=True)
    advantages   = [0.5, -0.5, -0.5, 0.5]              (normalize_by_std=False, Dr. GRPO)
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["grpo_advantages"]


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
