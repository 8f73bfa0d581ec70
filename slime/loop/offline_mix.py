"""Mixing offline data into the scheduler's batches (``--offline-data``, ``--offline-ratio R``).

``Scheduler.next_batch(n)`` puts the batch's share of pre-generated groups (``OFFLINE_VERSION`` tokens,
rewarded here if the file had no reward) at the front of ``ready`` and takes them with ``n`` minus that
many online groups. The share is exact over batches: after k batches, floor(k * n * R) offline groups.
Example: n=4, R=0.3 -> 1, 1, 1, 1, 2. Offline groups skip the dynamic-sampling filter and the staleness
drop. ``OfflineMixing`` holds the quota and the drawing of those groups; ``Scheduler`` inherits it.
"""

from __future__ import annotations

import math
from typing import Any

from slime.config import LoopConfig
from slime.loop.counters import StepStats
from slime.loop.scoring import Scorer
from slime.types import Group, Status

__all__ = ["OfflineMixing"]


class OfflineMixing:
    """The offline share of each batch (a mixin of ``slime.loop.scheduler.Scheduler``; ``offline`` is
    its ``slime.data.offline.OfflineSource``, or None for online only)."""

    config: LoopConfig
    offline: Any
    score: Scorer
    stats: StepStats
    rollout_id: int
    next_group_id: int

    def _offline_quota(self, n: int) -> int:
        """Offline groups in batch number ``rollout_id`` of ``n``: floor(k*n*R) - floor((k-1)*n*R)."""
        ratio = self.config.offline_ratio
        if self.offline is None or ratio <= 0:
            return 0
        k = self.rollout_id
        return math.floor(k * n * ratio + 1e-9) - math.floor((k - 1) * n * ratio + 1e-9)

    async def _offline_groups(self, num: int) -> list[Group]:
        """``num`` groups from the offline source, with fresh group ids, rewarded where the file had no reward."""
        groups = []
        for _ in range(num):
            group = self.offline.next_group(group_id=self.next_group_id, rollout_id=self.rollout_id)
            self.next_group_id += 1
            await self.score.offline(group)
            self.stats.offline_groups += 1
            self.stats.failed_samples += sum(s.status is Status.FAILED for s in group.samples)
            groups.append(group)
        return groups
