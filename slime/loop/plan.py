"""Which kind of RL run this is (``RunPlan``), read once from the flags that choose it, for the
builders of ``slime.loop.assemble`` and ``slime.loop.inputs``.

The kinds (docs in ``slime.loop.driver``): a full RL run (both sides, a weight sync per step),
rollout-only (``--debug-rollout-only``: no trainer) and train-only (``--load-debug-rollout-data``:
no engine); each step's groups come from one of three schedulers (``RunPlan.scheduler``).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Literal

from slime.config import DebugConfig, EngineConfig, RolloutConfig, SyncConfig, TrainConfig

__all__ = ["RunPlan", "SchedulerKind", "run_plan"]

log = logging.getLogger(__name__)

SchedulerKind = Literal["generate", "rollout_function", "replay"]
"""The scheduler that makes a step's groups (``slime.loop.assemble.SCHEDULERS``)."""


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Which kind of RL run this is, read once from the flags that choose it (``run_plan``)."""

    rollout_only: bool
    """``--debug-rollout-only``: no trainer, no weight sync; the version never moves."""
    train_only: bool
    """``--load-debug-rollout-data`` / ``--debug-train-only``: no engine, no generation, no eval."""
    megatron: bool
    scheduler: SchedulerKind
    colocate: bool
    """``--colocate`` with both sides running: engines release their memory around each train step."""
    base_model: str
    """``--hf-checkpoint``: the tokenizer's and a fresh run's weights."""
    opd_teacher: str | None
    """``--opd-teacher-load`` under ``--use-opd`` (its tokenizer must share the student's vocabulary)."""
    seed: int
    replay_template: str | None
    """The recorded groups a train-only run trains on."""
    record_template: str | None
    """``--save-debug-rollout-data``: where each step's groups are recorded."""
    newest_only: bool = False
    """``--mask-offpolicy-in-partial-rollout``: only each sample's newest version's tokens train (the loop masks
    the rest before its metrics count them; the trainer's batch applies the same mask again, a no-op then)."""

    @property
    def syncs(self) -> bool:
        """Both sides run, so every step's weights go to the engines."""
        return not (self.train_only or self.rollout_only)


def run_plan(
    debug: DebugConfig,
    rollout: RolloutConfig,
    train: TrainConfig,
    engine: EngineConfig,
    sync: SyncConfig,
    *,
    seed: int,
    run_dir: str | None = None,
) -> RunPlan:
    """The run's ``RunPlan``. A rollout-only run without ``--save-debug-rollout-data`` keeps its groups in
    ``run_dir/rollouts/rollout_{rollout_id}.jsonl`` (``slime.loop.record``; one line says where), or, with no
    ``run_dir``, warns that they are not kept."""
    rollout_only, train_only = debug.debug_rollout_only, debug.train_only
    record_template = debug.save_debug_rollout_data
    if rollout_only and not record_template:
        if run_dir is None:
            log.warning("--debug-rollout-only without --save-debug-rollout-data: the rollouts are not kept")
        else:
            record_template = str(Path(run_dir) / "rollouts" / "rollout_{rollout_id}.jsonl")
            log.info("rollouts kept in %s (JSON lines, one group a line; slime.loop.record)", record_template)
    scheduler: SchedulerKind = (
        "replay" if train_only else "rollout_function" if rollout.uses_rollout_function else "generate"
    )
    return RunPlan(
        rollout_only=rollout_only,
        train_only=train_only,
        megatron=train.train_backend == "megatron",
        scheduler=scheduler,
        colocate=sync.colocate and not (train_only or rollout_only),
        base_model=engine.hf_checkpoint,
        opd_teacher=engine.opd_teacher_load if train.use_opd else None,
        seed=seed,
        replay_template=debug.load_debug_rollout_data,
        record_template=record_template,
        newest_only=train.mask_offpolicy_in_partial_rollout,
    )
