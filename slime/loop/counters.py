"""What every scheduler (``Scheduler``, the train-only ``ReplayScheduler``, ``RolloutFunctionScheduler``)
counts and reads: per-step stats, the resumable counters and the run's policy version. The part of a
scheduler that the step, the RL mode and the driver use is ``slime.loop.interface.RolloutScheduler``."""

from __future__ import annotations

import dataclasses

from slime.loop.version import PolicyVersion

__all__ = ["StepStats", "SchedulerCounters"]


@dataclasses.dataclass
class StepStats:
    """Counters since the last ``pop_stats()``."""

    started_groups: int = 0
    finished_groups: int = 0
    filtered_groups: int = 0
    aborted_samples: int = 0
    resumed_samples: int = 0
    failed_samples: int = 0
    generated_tokens: int = 0
    filtered_tokens: int = 0
    dropped_stale_groups: int = 0
    offline_groups: int = 0
    evicted_groups: int = 0
    expired_groups: int = 0


class SchedulerCounters:
    """Resumable counters and per-step stats, the base of every scheduler; the policy version is read
    from the run's ``PolicyVersion`` (``slime.loop.version``), never kept here.

    Args:
        version: the run's ``PolicyVersion``; None = a fresh one at 0.
        next_group_id: the id the next admitted group gets.
    """

    def __init__(self, version: PolicyVersion | None = None, next_group_id: int = 0) -> None:
        self.version = version if version is not None else PolicyVersion()
        self.next_group_id = next_group_id
        self.num_admitted = 0
        """Groups admitted and not filtered out: the k of the admission bound."""
        self.rollout_id = 0
        self.stats = StepStats()

    @property
    def engine_version(self) -> int:
        """The policy version the engines hold (``version.engines``): what new tokens are stamped with."""
        return self.version.engines

    def counters(self) -> dict[str, int]:
        """The scheduler's own resumable counters (see ``slime.loop.checkpoint``)."""
        return {"next_group_id": self.next_group_id, "num_admitted": self.num_admitted, "rollout_id": self.rollout_id}

    def restore_counters(self, *, next_group_id: int, num_admitted: int, rollout_id: int) -> None:
        self.next_group_id, self.num_admitted, self.rollout_id = next_group_id, num_admitted, rollout_id

    def pop_stats(self) -> StepStats:
        stats, self.stats = self.stats, StepStats()
        return stats
