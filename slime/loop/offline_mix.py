"""Mixing offline data into the scheduler's batches (``--offline-data``, ``--offline-ratio R``).

``Scheduler.next_batch(n)`` puts the batch's share of pre-generated groups (``OFFLINE_VERSION`` tokens,
rewarded here if the file had no reward) at the front of ``ready`` and takes them with ``n`` minus that
many online groups. The share is exact over batches: after k batches, floor(k * n * R) offline groups.
Example: n=4, R=0.3 -> 1, 1, 1, 1, 2. Offline groups skip the dynamic-sampling filter and the staleness
drop. ``OfflineMix`` holds the quota and the drawing of those groups; ``Scheduler`` holds one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from slime.loop.counters import StepStats
from slime.loop.scoring import Scorer
from slime.types import Group, Status

if TYPE_CHECKING:
    from slime.data.offline import OfflineSource

__all__ = ["OfflineMix"]


class OfflineMix:
    """The offline share of each batch.

    Args:
        source: the pre-generated groups (``slime.data.offline.OfflineSource``), or None for online only.
        ratio: ``--offline-ratio``, the share of each batch taken from ``source``.
        score: rewards a group whose file had none (``Scorer.offline``).
        take_group_id: hands out the next group id (the scheduler's counter, shared with online groups).
    """

    def __init__(
        self, source: OfflineSource | None, ratio: float, score: Scorer, take_group_id: Callable[[], int]
    ) -> None:
        self.source, self.ratio, self.score, self.take_group_id = source, ratio, score, take_group_id

    def quota(self, rollout_id: int, n: int) -> int:
        """Offline groups in batch number ``rollout_id`` of ``n``: floor(k*n*R) - floor((k-1)*n*R)."""
        if self.source is None or self.ratio <= 0:
            return 0
        k = rollout_id
        return math.floor(k * n * self.ratio + 1e-9) - math.floor((k - 1) * n * self.ratio + 1e-9)

    async def groups(self, num: int, *, rollout_id: int, stats: StepStats) -> list[Group]:
        """``num`` groups from the source, with fresh group ids, rewarded where the file had no reward."""
        groups = []
        for _ in range(num):
            assert self.source is not None  # quota() is 0 without one
            group = self.source.next_group(group_id=self.take_group_id(), rollout_id=rollout_id)
            await self.score.offline(group)
            stats.offline_groups += 1
            stats.failed_samples += sum(s.status is Status.FAILED for s in group.samples)
            groups.append(group)
        return groups
