"""Off-policy accounting at consumption: staleness masking and version-lag statistics.

The lag of a token is ``trainer_version - token_version``: 0 for a token sampled by the weights
being trained, k for one sampled k weight updates ago. Tokens with lag > ``max_staleness`` are
masked out of the loss (ARCHITECTURE.md invariant 4); the importance-sampling correction of what
remains (TIS, MIS, decoupled PPO) is applied by the trainer (``slime/train/offpolicy.py``).

Example: trainer at version 6, ``max_staleness=2``, one sample with versions [3, 3, 5, 6] ->
lags [3, 3, 1, 0] -> 2 tokens masked; histogram {0: 1, 1: 1, 3: 2}; off-policy fraction 0.75;
the sample spans 3 versions.

FAILED samples (``Sample.is_valid`` False) never train: they are neither masked nor counted here.

Offline tokens (``OFFLINE_VERSION``, ``--offline-data``) were sampled by no policy of this run: they
are never masked for staleness, are left out of the lag statistics, and are counted as ``offline_tokens``.
"""

from __future__ import annotations

from collections import Counter

from slime.types import OFFLINE_VERSION, Group, valid_samples

__all__ = ["apply_staleness"]


def apply_staleness(
    groups: list[Group], *, trainer_version: int, max_staleness: int
) -> dict[str, float | dict[int, int]]:
    """Mask over-stale tokens in place and return lag statistics of the batch.

    Returns:
        ``lag_histogram`` {lag: num_tokens} over model tokens, ``off_policy_token_fraction``
        (lag > 0), ``max_version_lag``, ``masked_stale_tokens``, ``max_versions_in_a_sample``,
        ``multi_version_samples`` (samples whose tokens come from >= 2 versions), ``offline_tokens``.
    """
    hist: Counter[int] = Counter()
    masked = offline = 0
    max_spanned = 0
    multi = 0
    for s in valid_samples(groups):
        for v, m in zip(s.versions, s.loss_mask):  # loss_mask 0 tokens never train, so their lag is not counted
            if m and v == OFFLINE_VERSION:
                offline += 1
            elif m:
                # counted before mask_stale below: the histogram shows the over-stale tokens it then masks
                hist[trainer_version - v] += 1
        # counted for valid samples only: the FAILED ones are masked below, uncounted
        masked += s.mask_stale(trainer_version, max_staleness)
        spanned = s.num_versions_spanned
        max_spanned = max(max_spanned, spanned)
        multi += spanned >= 2
    for g in groups:  # a FAILED sample never trains, but its loss mask must not mark a stale token trainable
        for s in g.samples:
            if not s.is_valid:
                s.mask_stale(trainer_version, max_staleness)
    total = sum(hist.values())
    off = sum(n for lag, n in hist.items() if lag > 0)
    return {
        "lag_histogram": dict(sorted(hist.items())),
        "off_policy_token_fraction": off / total if total else 0.0,
        "max_version_lag": max(hist) if hist else 0,
        "masked_stale_tokens": masked,
        "max_versions_in_a_sample": max_spanned,
        "multi_version_samples": multi,
        "offline_tokens": offline,
    }
