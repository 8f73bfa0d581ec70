"""The data buffer between rollout and training: ready groups, and the partial-rollout queue.

- ``ready``: finished, rewarded groups waiting for a train step, oldest first. Groups that finish
  after a step's target was reached stay here for the next step (never dropped).
- ``partial``: aborted groups, kept with every token they had, in a priority queue served before
  any new prompt. Default priority: the group whose oldest token is oldest goes first (so that
  stale tokens are trained, or expire, as early as possible), ties broken by group id.

Every group id enters the buffer's ``taken`` set exactly once, when the trainer takes it; taking a
group twice raises (invariant 2 of ARCHITECTURE.md).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable

from slime.errors import PluginError
from slime.types import Group

__all__ = ["DataBuffer"]


class DataBuffer:
    def __init__(self, *, buffer_filter: Callable[[int, list[Group], int], list[Group]] | None = None) -> None:
        self.buffer_filter = buffer_filter
        """Optional ``(rollout_id, partial_groups, num) -> chosen`` replacing the default order."""
        self.ready: deque[Group] = deque()
        self._partial: list[tuple[int, int, Group]] = []
        self.taken: set[int] = set()

    # -- partial rollouts ---------------------------------------------------------------------
    def push_partial(self, group: Group) -> None:
        oldest = group.oldest_version
        heapq.heappush(self._partial, (oldest if oldest is not None else 1 << 62, group.group_id, group))

    def pop_partial(self, rollout_id: int = 0) -> Group | None:
        """The next partial group to resume (oldest version first, or ``buffer_filter``'s pick)."""
        if not self._partial:
            return None
        if self.buffer_filter is None:
            return heapq.heappop(self._partial)[2]
        groups = self.partial_groups()
        chosen = self.buffer_filter(rollout_id, groups, 1)
        if not chosen:
            return None
        if len(chosen) != 1 or not any(chosen[0] is g for g in groups):
            raise PluginError(f"--buffer-filter-path returned {len(chosen)} groups not taken from the {len(groups)} queued ones")
        self._partial = [e for e in self._partial if e[2] is not chosen[0]]
        heapq.heapify(self._partial)
        return chosen[0]

    @property
    def num_partial(self) -> int:
        return len(self._partial)

    def partial_groups(self) -> list[Group]:
        return [g for _, _, g in sorted(self._partial)]

    def restore(self, *, ready: list[Group], partial: list[Group], taken: list[int]) -> None:
        """Refill from a checkpoint (``slime.loop.checkpoint``)."""
        self.ready = deque(ready)
        self._partial = []
        for g in partial:
            self.push_partial(g)
        self.taken = set(taken)

    # -- ready groups ---------------------------------------------------------------------------
    def push_ready(self, group: Group) -> None:
        self.ready.append(group)

    @property
    def num_ready(self) -> int:
        return len(self.ready)

    def take(self, n: int) -> list[Group]:
        """Remove and return the ``n`` oldest ready groups.

        Raises:
            ValueError: fewer than ``n`` are ready.
            RuntimeError: a group id was already taken once (a group trained twice).
        """
        if n > len(self.ready):
            raise ValueError(f"asked for {n} ready groups, {len(self.ready)} ready")
        out = [self.ready.popleft() for _ in range(n)]
        for g in out:
            if g.group_id in self.taken:
                raise RuntimeError(f"group {g.group_id} handed to the trainer twice")
            self.taken.add(g.group_id)
        return out
