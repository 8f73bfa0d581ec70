"""Off-policy accounting at consumption: staleness masking, version-lag statistics of what trains, and
the length bias of the batch against the draws completed in the same window.

The lag of a token is ``trainer_version - token_version``: 0 for a token sampled by the weights
being trained, k for one sampled k weight updates ago. Tokens with lag > ``max_staleness`` are
masked out of the loss (ARCHITECTURE.md invariant 4); the importance-sampling correction of what
remains (TIS, MIS, decoupled PPO) is applied by the trainer (``slime/train/offpolicy.py``).

Every statistic is over the tokens that train, i.e. counted AFTER the mask: the masked ones are
counted apart (``masked_stale_tokens``, ``masked_token_fraction``). Example: trainer at version 6,
``max_staleness=2``, one sample with versions [3, 3, 5, 6] -> lags [3, 3, 1, 0] -> 2 tokens masked
(masked share 0.5); histogram {0: 1, 1: 1}; off-policy fraction 0.5; max lag 1; the sample spans 3
versions. (``--mask-offpolicy-in-partial-rollout`` masks further inside the trainer: its
``train/num_train_tokens`` and ``train/staleness_mean`` count after that mask too.)

FAILED samples (``Sample.is_valid`` False) never train: they are neither masked nor counted here.

Offline tokens (``OFFLINE_VERSION``, ``--offline-data``) were sampled by no policy of this run: they
are never masked for staleness, are left out of the lag statistics, and are counted as ``offline_tokens``.

``length_bias`` compares the samples trained in a step with the draws completed (finished and rewarded)
since the last step (``DataBuffer.pop_completed``): an unbiased consumer trains lengths and rewards as
they are drawn (ratios 1, long share = that of the completed draws); APRIL, which trains the groups
that finish first, trains shorter samples and older long ones.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

from slime.step_record import off_policy_share
from slime.types import OFFLINE_VERSION, Group, Sample, valid_samples

__all__ = ["apply_staleness", "length_bias"]


def apply_staleness(
    groups: list[Group], *, trainer_version: int, max_staleness: int, newest_only: bool = False
) -> dict[str, float | dict[int, int]]:
    """Mask over-stale tokens in place and return lag statistics of the tokens left to train.

    ``newest_only`` (``--mask-offpolicy-in-partial-rollout``) also masks each sample's tokens of versions
    older than its newest (``Sample.mask_older_versions``), so the statistics count what the trainer
    trains; those tokens count in ``masked_stale_tokens``.

    Returns:
        ``lag_histogram`` {lag: num_tokens} over trained model tokens, ``off_policy_token_fraction``
        (lag > 0, of trained tokens), ``max_version_lag`` (of a trained token), ``masked_stale_tokens``,
        ``masked_token_fraction`` (masked / model tokens under the loss mask before masking),
        ``fully_masked_samples`` (valid samples left with no trained token), ``max_versions_in_a_sample``,
        ``multi_version_samples`` (samples whose tokens come from >= 2 versions), ``offline_tokens``;
        ``trained_samples`` (valid samples keeping >= 1 trained token), ``trained_sample_response_tokens``
        and ``trained_sample_reward_sum`` (their response lengths and rewards, summed: what a per-trained-
        sample mean divides). ``off_policy_token_fraction`` is NaN when no token trains (no share to give).
    """
    hist: Counter[int] = Counter()
    masked = offline = max_spanned = multi = fully_masked = 0
    valid = valid_samples(groups)
    for s in valid:
        had_tokens = any(s.loss_mask)
        masked += s.mask_stale(trainer_version, max_staleness)
        if newest_only:
            masked += s.mask_older_versions()
        # counted after the mask: the histogram says what trains (loss_mask 0 tokens never train)
        for v, m in zip(s.versions, s.loss_mask):
            if m and v == OFFLINE_VERSION:
                offline += 1
            elif m:
                hist[trainer_version - v] += 1
        fully_masked += had_tokens and not any(s.loss_mask)
        spanned = s.num_versions_spanned
        max_spanned = max(max_spanned, spanned)
        multi += spanned >= 2
    for g in groups:  # a FAILED sample never trains, but its loss mask must not mark a stale token trainable
        for s in g.samples:
            if not s.is_valid:
                s.mask_stale(trainer_version, max_staleness)
    total = sum(hist.values())
    share = off_policy_share(hist)
    return {
        "lag_histogram": dict(sorted(hist.items())),
        "off_policy_token_fraction": math.nan if share is None else share,
        "max_version_lag": max(hist) if hist else 0,
        "masked_stale_tokens": masked,
        "masked_token_fraction": masked / (total + masked) if total + masked else 0.0,
        "fully_masked_samples": fully_masked,
        "max_versions_in_a_sample": max_spanned,
        "multi_version_samples": multi,
        "offline_tokens": offline,
        **_trained_samples(valid),
    }


def _trained_samples(samples: list[Sample]) -> dict[str, float]:
    """The samples left with >= 1 trained token (call after masking): their number, and their response tokens
    and rewards summed. Example: lengths 10 and 90, rewards 1 and 0, the second masked whole -> 1, 10, 1.0."""
    trained = [s for s in samples if any(s.loss_mask)]
    return {
        "trained_samples": len(trained),
        "trained_sample_response_tokens": sum(len(s.response_ids) for s in trained),
        "trained_sample_reward_sum": sum(s.reward or 0.0 for s in trained),
    }


def _long_threshold(lengths: Sequence[int]) -> float:
    """The longest quartile's lower bound: the 75th percentile of ``lengths`` (inclusive method)."""
    return statistics.quantiles(lengths, n=4, method="inclusive")[2] if len(lengths) > 1 else float(lengths[0])


def _mean_lag(samples: list[Sample], trainer_version: int) -> float:
    """Mean version lag of the trained (loss-masked, online) tokens of ``samples``; NaN when none trains."""
    lags = [trainer_version - v for s in samples for v, m in zip(s.versions, s.loss_mask) if m and v != OFFLINE_VERSION]
    return statistics.fmean(lags) if lags else float("nan")


def length_bias(
    groups: list[Group], completed: Sequence[tuple[int, float]], *, trainer_version: int
) -> dict[str, float]:
    """The batch's length and reward bias against the draws completed in the same window (module doc).

    Call after ``apply_staleness`` (the loss masks say what trains). A sample is *trained* when it is
    valid, online and keeps at least one trained token.

    Args:
        groups: the step's groups.
        completed: (response tokens, reward) of every valid online sample completed in the window.
        trainer_version: the version being trained (for the lags).

    Returns:
        {} when nothing completed or nothing trains; else ``len_ratio`` (mean response length trained /
        completed), ``reward_gap`` (mean reward trained - completed), ``long_share`` / ``long_share_completed``
        (share of trained / completed samples in the completed draws' longest quartile: length >= their
        p75), ``long_token_share`` (trained / response tokens of the trained long samples: what the mask
        left of them), ``age_short`` / ``age_long`` (mean lag in versions of the trained tokens of samples
        under / at or over that p75; NaN when a bucket is empty).
    """
    trained = [
        s for s in valid_samples(groups) if any(s.loss_mask) and OFFLINE_VERSION not in s.versions[:1]
    ]  # an offline group's tokens all carry OFFLINE_VERSION: its first says so
    if not completed or not trained:
        return {}
    lengths = [n for n, _ in completed]
    p75 = _long_threshold(lengths)
    long_ = [s for s in trained if len(s.response_ids) >= p75]
    short = [s for s in trained if len(s.response_ids) < p75]
    long_response = sum(len(s.response_ids) for s in long_)
    return {
        "len_ratio": statistics.fmean(len(s.response_ids) for s in trained) / max(statistics.fmean(lengths), 1e-9),
        "reward_gap": statistics.fmean(s.reward or 0.0 for s in trained) - statistics.fmean(r for _, r in completed),
        "long_share": len(long_) / len(trained),
        "long_share_completed": sum(n >= p75 for n in lengths) / len(lengths),
        "long_token_share": sum(sum(s.loss_mask) for s in long_) / long_response if long_response else float("nan"),
        "age_short": _mean_lag(short, trainer_version),
        "age_long": _mean_lag(long_, trainer_version),
    }
