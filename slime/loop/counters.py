"""What every scheduler (``Scheduler``, the train-only ``ReplayScheduler``, ``RolloutFunctionScheduler``)
counts and reads: per-step stats, the resumable counters and the run's policy version; and
``RolloutScheduler``, the part of a scheduler that the step, the RL mode and the driver use."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from slime.loop.version import PolicyVersion

if TYPE_CHECKING:
    from slime.config import LoopConfig
    from slime.engines.interface import EnginePool
    from slime.loop.buffer import DataBuffer
    from slime.types import Group

__all__ = ["StepStats", "SchedulerCounters", "RolloutScheduler"]


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
    """Resumable counters and per-step stats, shared by every scheduler; the policy version is read
    from the run's ``PolicyVersion`` (``slime.loop.version``), never kept here."""

    next_group_id: int
    num_admitted: int
    rollout_id: int
    stats: StepStats
    version: PolicyVersion

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


class RolloutScheduler(Protocol):
    """What ``slime.loop.step.run_step``, ``slime.loop.rl_mode.RLMode`` and the driver use of a scheduler;
    ``Scheduler``, ``ReplayScheduler`` and ``RolloutFunctionScheduler`` all follow it (the driver holds
    any of the three in one variable)."""

    @property
    def config(self) -> LoopConfig: ...

    @property
    def version(self) -> PolicyVersion:
        """The run's policy version (``slime.loop.version``)."""
        ...

    @property
    def pool(self) -> EnginePool | None:
        """The engines generating the groups; None: no engine (train-only)."""
        ...

    @property
    def buffer(self) -> DataBuffer: ...

    @property
    def rollout_id(self) -> int:
        """Batches taken so far (the record of step N is rollout N)."""
        ...

    async def next_batch(self, n: int) -> list[Group]:
        """The next step's ``n`` groups (a replay: the recorded ones), taken from the buffer."""
        ...

    def paused(self, mode: Literal["abort", "in_place"] = "abort") -> AbstractAsyncContextManager[Any]:
        """Hold generation for a weight update or an eval."""
        ...

    def quiesced(self) -> AbstractAsyncContextManager[Any]:
        """Nothing in flight and every group in the buffer (for a checkpoint)."""
        ...

    async def shutdown(self) -> None:
        """Stop generating; leftovers stay in the buffer."""
        ...

    def pop_stats(self) -> StepStats: ...

    def counters(self) -> dict[str, int]: ...

    def restore_counters(self, *, next_group_id: int, num_admitted: int, rollout_id: int) -> None: ...
