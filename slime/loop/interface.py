"""The loop's Protocols: what a kind of run adds to the run skeleton (``RunMode``) and what the step,
the RL mode and the driver use of a scheduler (``RolloutScheduler``).

``RLMode`` (``slime.loop.rl_mode``) and ``SFTMode`` (``slime.loop.sft``) follow ``RunMode``;
``Scheduler`` (``slime.loop.scheduler``), the train-only ``ReplayScheduler`` (``slime.loop.record``)
and ``RolloutFunctionScheduler`` (``slime.loop.rollout_function``) follow ``RolloutScheduler``.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from slime.step_record import SFTStepRecord, StepRecord

if TYPE_CHECKING:
    from slime.config import LoopConfig
    from slime.engines.interface import EnginePool
    from slime.loop.buffer import DataBuffer
    from slime.loop.checkpoint import LoopState
    from slime.loop.counters import StepStats
    from slime.loop.version import PolicyVersion
    from slime.train.interface import Trainer
    from slime.types import Group

__all__ = ["RunMode", "RolloutScheduler", "Record"]

Record = TypeVar("Record", StepRecord, SFTStepRecord)
"""The step record of a kind of run: ``StepRecord`` (RL) or ``SFTStepRecord``."""


class RunMode(Protocol[Record]):
    """What a kind of run adds to the skeleton (``slime.loop.run.run_steps``)."""

    trainer: Trainer | None
    """Saved in checkpoints (``slime.loop.checkpoint``); None: no checkpoints (rollout-only)."""

    async def step(self, step: int) -> tuple[Record, list[dict[str, object]]]:
        """Run step ``step`` (1-based); returns its record and the trained-log lines."""
        ...

    async def evaluate(self, step: int) -> None:
        """A mid-run or first eval: writes its own record (``step`` 0: before the first step)."""
        ...

    def step_line(self, record: Record) -> str:
        """The progress line of a step record."""
        ...

    def loop_state(self, step: int) -> LoopState:
        """What a checkpoint after ``step`` holds besides the trainer."""
        ...

    def quiesced(self) -> AbstractAsyncContextManager[None]:
        """An async context with nothing in flight, for a checkpoint."""
        ...


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

    def paused(self, mode: Literal["abort", "in_place"] = "abort") -> AbstractAsyncContextManager[None]:
        """Hold generation for a weight update or an eval."""
        ...

    def quiesced(self) -> AbstractAsyncContextManager[None]:
        """Nothing in flight and every group in the buffer (for a checkpoint)."""
        ...

    async def shutdown(self) -> None:
        """Stop generating; leftovers stay in the buffer."""
        ...

    def pop_stats(self) -> StepStats: ...

    def counters(self) -> dict[str, int]: ...

    def restore_counters(self, *, next_group_id: int, num_admitted: int, rollout_id: int) -> None: ...
