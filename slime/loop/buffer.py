"""The data buffer between rollout and training: ready groups, and the partial-rollout queue.

- ``ready``: finished, rewarded groups waiting for a train step, oldest first. Groups that finish
  after a step's target was reached stay here for the next step (never dropped).
- ``partial``: aborted groups, kept with every token they had, in a priority queue served before
  any new prompt. Default priority: the group whose oldest token is oldest goes first (so that
  stale tokens are trained, or expire, as early as possible), ties broken by group id.

Two bounds lose partial groups on purpose, each counted (``num_evicted``, ``num_expired``, saved in
checkpoints) and logged; ready groups are never lost:

- capacity (``--buffer-capacity``): when ready + partial groups exceed it, the oldest partial
  groups (the head of the default order) are evicted. Example: capacity 4, 3 ready and 1 partial,
  a 5th group arrives -> the partial one is evicted and its tokens are gone.
- staleness (``max_staleness``): ``expire(v)`` removes the partial groups whose oldest token is
  more than ``max_staleness`` versions behind engine version ``v``. Example: ``max_staleness=2``,
  a partial group whose first token is of version 3 expires once the engines hold version 6.

Every group id enters the buffer's ``taken`` set exactly once, when the trainer takes it; taking a
group twice raises (invariant 2 of ARCHITECTURE.md).
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable

from slime.errors import PluginError
from slime.types import OFFLINE_VERSION, Group

__all__ = ["DataBuffer"]

log = logging.getLogger(__name__)

_NO_VERSION = 1 << 62  # sorts a partial group without tokens last


def _ready_key(group: Group) -> int:
    oldest = group.oldest_version
    return oldest if oldest is not None else group.rollout_id  # no tokens yet: ranked by the batch it was started for


class DataBuffer:
    """Ready groups and the partial-rollout queue.

    Args:
        buffer_filter: optional ``(rollout_id, partial_groups, num) -> chosen`` replacing the
            default resume order (``--buffer-filter-path``).
        capacity: ready + partial groups held at most (``--buffer-capacity``); None = no bound.
        max_staleness: partial groups whose oldest token lags more than this are expired by
            ``expire``; None = never.
    """

    def __init__(
        self,
        *,
        buffer_filter: Callable[[int, list[Group], int], list[Group]] | None = None,
        capacity: int | None = None,
        max_staleness: int | None = None,
    ) -> None:
        self.buffer_filter = buffer_filter
        self.capacity = capacity
        self.max_staleness = max_staleness
        self.ready: deque[Group] = deque()
        self._partial: list[tuple[int, int, Group]] = []
        self.taken: set[int] = set()
        self.num_evicted = 0
        """Partial groups dropped because the buffer was full (their tokens are lost)."""
        self.num_expired = 0
        """Partial groups dropped because their oldest token was over ``max_staleness``."""
        self._completed: list[tuple[int, float]] = []  # since the last pop_completed (not checkpointed)

    # -- partial rollouts ---------------------------------------------------------------------
    def push_partial(self, group: Group) -> list[Group]:
        """Queue an aborted group; returns the partial groups evicted to stay within capacity."""
        oldest = group.oldest_version
        # oldest token first, so stale tokens resume (and train or expire) soonest; the group id breaks ties
        heapq.heappush(self._partial, (oldest if oldest is not None else _NO_VERSION, group.group_id, group))
        return self._evict()  # a push can exceed --buffer-capacity: the oldest partials make room, never a ready group

    def pop_partial(self, rollout_id: int = 0) -> Group | None:
        """The next partial group to resume (oldest version first, or ``buffer_filter``'s pick)."""
        if not self._partial:
            return None
        if self.buffer_filter is None:
            return heapq.heappop(self._partial)[2]
        groups = self.partial_groups()
        chosen = self.buffer_filter(rollout_id, groups, 1)
        if not chosen:  # the filter may hold every partial back: the scheduler then starts a new prompt instead
            return None
        if len(chosen) != 1 or not any(chosen[0] is g for g in groups):
            raise PluginError(
                f"--buffer-filter-path returned {len(chosen)} groups not taken from the {len(groups)} queued ones"
            )
        self._partial = [e for e in self._partial if e[2] is not chosen[0]]
        heapq.heapify(self._partial)  # the filter's pick may sit anywhere in the heap: restore the heap order
        return chosen[0]

    def expire(self, current_version: int) -> list[Group]:
        """Remove and return the partial groups whose oldest token is more than ``max_staleness``
        versions behind ``current_version`` (none when ``max_staleness`` is None)."""
        out: list[Group] = []
        if self.max_staleness is None:
            return out
        # the head holds the oldest token: once it is recent enough, every other partial is too
        while self._partial and current_version - self._partial[0][0] > self.max_staleness:
            out.append(heapq.heappop(self._partial)[2])
        if out:
            self.num_expired += len(out)
            log.info(
                "expired %d partial groups (ids %s) older than --max-staleness=%d at version %d; %d expired so far",
                len(out),
                [g.group_id for g in out],
                self.max_staleness,
                current_version,
                self.num_expired,
            )
        return out

    def _evict(self) -> list[Group]:
        out: list[Group] = []
        # only partials are evicted: a ready group is finished and rewarded, never lost
        while self.capacity is not None and self._partial and self.num_ready + self.num_partial > self.capacity:
            out.append(heapq.heappop(self._partial)[2])
        if out:
            self.num_evicted += len(out)
            log.warning(
                "buffer full (--buffer-capacity=%d): evicted %d partial groups (ids %s) with %d tokens; they are "
                "lost on purpose, %d evicted so far",
                self.capacity,
                len(out),
                [g.group_id for g in out],
                sum(g.num_response_tokens for g in out),
                self.num_evicted,
            )
        return out

    @property
    def num_partial(self) -> int:
        return len(self._partial)

    def partial_groups(self) -> list[Group]:
        return [g for _, _, g in sorted(self._partial, key=lambda e: e[:2])]

    def restore(
        self, *, ready: list[Group], partial: list[Group], taken: list[int], num_evicted: int = 0, num_expired: int = 0
    ) -> None:
        """Refill from a checkpoint (``slime.loop.checkpoint``)."""
        self.ready = deque(ready)
        self._partial = []
        for g in partial:
            oldest = g.oldest_version
            # push_partial's key, so a resumed run resumes partials in the same order
            heapq.heappush(self._partial, (oldest if oldest is not None else _NO_VERSION, g.group_id, g))
        self.taken = set(taken)
        self.num_evicted, self.num_expired = num_evicted, num_expired

    # -- ready groups ---------------------------------------------------------------------------
    def push_ready(self, group: Group, *, front: bool = False) -> list[Group]:
        """Add a finished group (at the front: taken first); returns the partial groups evicted.

        Its valid online samples count as completed draws (``pop_completed``); offline groups do not."""
        if group.oldest_version != OFFLINE_VERSION:
            self._completed += [(len(s.response_ids), s.reward or 0.0) for s in group.valid_samples]
        if front:
            self.ready.appendleft(group)
        else:
            self.ready.append(group)
        return self._evict()  # a ready group counts toward the capacity too: partials make room for it

    def pop_completed(self) -> list[tuple[int, float]]:
        """(response tokens, reward) of each valid online sample that became ready since the last call:
        the draws a step's trained samples are compared with (``slime.loop.offpolicy.length_bias``)."""
        out, self._completed = self._completed, []
        return out

    @property
    def num_ready(self) -> int:
        return len(self.ready)

    def take(self, n: int) -> list[Group]:
        """Remove and return ``n`` ready groups, those holding the oldest tokens first.

        Order: by the group's oldest token version (offline groups, ``OFFLINE_VERSION`` = -1, come
        first; a group without tokens counts from its ``rollout_id``), then by arrival. A long-tail
        group that finishes late carries the stalest tokens, so it is trained before fresher groups
        that finished earlier: this keeps the version lag, and what ``--staleness-policy`` masks or
        drops, as small as the data allows. With a single version (``sync``) it is plain FIFO.

        Raises:
            ValueError: fewer than ``n`` are ready.
            RuntimeError: a group id was already taken once (a group trained twice).
        """
        if n > len(self.ready):
            raise ValueError(f"asked for {n} ready groups, {len(self.ready)} ready")
        # Stable sort: ties keep their arrival order, so with one version (sync) this is FIFO.
        order = sorted(range(len(self.ready)), key=lambda i: _ready_key(self.ready[i]))[:n]
        out = [self.ready[i] for i in order]
        chosen = set(order)
        self.ready = deque(g for i, g in enumerate(self.ready) if i not in chosen)
        for g in out:  # invariant 2: a group trains at most once, across checkpoint resumes too (taken is saved)
            if g.group_id in self.taken:
                raise RuntimeError(f"group {g.group_id} handed to the trainer twice")
            self.taken.add(g.group_id)
        return out
