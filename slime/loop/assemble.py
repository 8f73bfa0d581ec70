"""The RL run's builders: each makes one part of the run from the config sections that define it.

``slime.loop.driver.run_training`` calls them in this order (assemble, then drive)::

    plan    = run_plan(debug, rollout, train, engine, sync, seed=...)  # slime.loop.plan: which kind of run
    inputs  = await build_inputs(data, rollout, loop, plan)           # slime.loop.inputs: prompts, reward, generate, offline
    trainer = await build_trainer(train, plan, ...)                   # None: rollout-only
    parts   = RunParts(files, version, inputs, trainer, build_buffer(loop));  await restore(parts)  # on a resume
    async with open_engines(engine, rollout, train, sync, plan, parts) as engines:   # None: train-only
        sync  = build_sync(sync, plan, pool=..., trainer=...)         # NoWeightSync unless both sides run
        sched = build_scheduler(SchedulerWiring(loop, rollout, data, plan, parts, ...))  # SCHEDULERS[plan.scheduler]

Three schedulers make a step's groups (``SCHEDULERS``): ``generate`` (``slime.loop.scheduler.Scheduler``:
the engines generate, rewards score; rollout-only runs it with the version fixed), ``rollout_function``
(``--rollout-function-path``: one user call per step) and ``replay`` (train-only: the recorded groups).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec

from slime.config import DataConfig, EngineConfig, LoopConfig, RolloutConfig, SyncConfig, TrainConfig
from slime.config.rollout import builtin_rollout_note
from slime.config.root import TrainerKwargs
from slime.engines.fleet.host import trainer_gpus
from slime.engines.fleet.start import RolloutEngines, load_initial_weights, start_rollout
from slime.engines.interface import WorkerPool
from slime.errors import ConfigError
from slime.loop.buffer import DataBuffer
from slime.loop.checkpoint import load_checkpoint
from slime.loop.inputs import RunInputs, with_offline_logprobs
from slime.loop.interface import RolloutScheduler
from slime.loop.plan import RunPlan, SchedulerKind
from slime.loop.record import NoWeightSync, ReplayScheduler
from slime.loop.rollout_function import RolloutFunctionScheduler
from slime.loop.run import RunFiles
from slime.loop.scheduler import Scheduler
from slime.loop.version import PolicyVersion
from slime.obs.trace import NullTracer, Tracer
from slime.rollout.opd import TeacherScorer
from slime.rollout.rewards import load_function
from slime.sync import WeightSync, build_weight_sync
from slime.train.interface import Trainer
from slime.train_metrics import TrainMetrics
from slime.types import Group

__all__ = [
    "RunParts",
    "SCHEDULERS",
    "megatron_rank_served",
    "resumed_version",
    "build_trainer",
    "build_buffer",
    "restore",
    "open_engines",
    "build_sync",
    "eval_kwargs",
    "build_scheduler",
    "train_step_of",
    "close_parts",
]

log = logging.getLogger(__name__)


async def megatron_rank_served(train: TrainConfig, plan: RunPlan, *, resumes: bool, kwargs: TrainerKwargs) -> bool:
    """``--train-backend megatron`` on a torchrun rank other than 0: serve rank 0's train steps until the
    run ends and return True; False on rank 0 (and for the torch backend), which drives the run.

    Raises:
        ConfigError: ``resumes`` (``--save-interval`` / ``--load``): not implemented for megatron yet.
    """
    if not plan.megatron:
        return False
    from slime.train.megatron.trainer import serve_if_worker

    if resumes:
        raise ConfigError(
            "--save-interval / --load: checkpoint and resume are not implemented for --train-backend megatron yet"
        )
    train_cfg = msgspec.structs.replace(train, ref_load=train.ref_load or plan.base_model)
    return await asyncio.to_thread(serve_if_worker, train_cfg, model_dir=plan.base_model, **kwargs)


def resumed_version(files: RunFiles) -> PolicyVersion:
    """The run's ``PolicyVersion``: the checkpoint's on a resume (logged), else 0."""
    if files.resume is None:
        return PolicyVersion(0)
    log.info(
        "resuming from %s (step %d, policy version %d)",
        files.checkpoint,
        files.resume.step,
        files.resume.policy_version,
    )
    return PolicyVersion(files.resume.policy_version)


def model_dir(files: RunFiles, base_model: str) -> str:
    """The weights the run starts from: the resumed checkpoint's ``model/``, else ``--hf-checkpoint``."""
    return str(files.checkpoint / "model") if files.checkpoint else base_model


async def build_trainer(
    train: TrainConfig, plan: RunPlan, *, start_from: str, version: PolicyVersion, kwargs: TrainerKwargs
) -> Trainer | None:
    """The run's trainer (loads ``start_from`` in a thread): ``MegatronTrainer`` with ``--train-backend
    megatron``, else ``TorchTrainer``; None for a rollout-only run."""
    if plan.rollout_only:
        return None
    # the KL reference defaults to the base model, also when the run resumes from a checkpoint
    train_cfg = msgspec.structs.replace(train, ref_load=train.ref_load or plan.base_model)
    if plan.megatron:
        from slime.train.megatron.trainer import MegatronTrainer

        # policy_version: the trainer's counter starts at the run's, so PolicyVersion.bump's check holds on a resume
        return await asyncio.to_thread(
            MegatronTrainer, train_cfg, model_dir=start_from, policy_version=version.trainer, **kwargs
        )
    from slime.train.torch_backend import TorchTrainer

    # policy_version: the trainer's counter starts at the run's, so PolicyVersion.bump's check holds on a resume
    return await asyncio.to_thread(
        TorchTrainer, train_cfg, model_dir=start_from, policy_version=version.trainer, **kwargs
    )


def build_buffer(loop: LoopConfig) -> DataBuffer:
    """The ready/partial group buffer of ``--buffer-capacity``, ``--buffer-filter-path`` and ``--max-staleness``."""
    return DataBuffer(
        buffer_filter=load_function(loop.buffer_filter_path, flag="--buffer-filter-path")
        if loop.buffer_filter_path
        else None,
        capacity=loop.buffer_capacity,
        # expire over-stale partial groups only under --staleness-policy drop; with mask
        # their old tokens are masked and their new tokens still train
        max_staleness=loop.max_staleness if loop.staleness_policy == "drop" else None,
    )


@dataclasses.dataclass
class RunParts:
    """What the run has built before its engines start."""

    files: RunFiles
    version: PolicyVersion
    inputs: RunInputs
    trainer: Trainer | None
    buffer: DataBuffer


async def restore(parts: RunParts) -> None:
    """On a resume (``files.resume``): the trainer from the checkpoint, then the data position, the buffer
    and the offline position from its loop state (``slime.loop.checkpoint``)."""
    ckpt, resume = parts.files.checkpoint, parts.files.resume
    if ckpt is None or resume is None:  # both or neither (open_run_dir)
        return
    await asyncio.to_thread(load_checkpoint, ckpt, trainer=parts.trainer)
    parts.inputs.source.load_state_dict(resume.source)
    parts.buffer.restore(
        ready=resume.ready,
        partial=resume.partial,
        taken=resume.taken,  # with the taken ids: a group trained before the checkpoint is never trained again
        num_evicted=resume.num_evicted,
        num_expired=resume.num_expired,
    )
    if parts.inputs.offline is not None and resume.offline_source is not None:
        parts.inputs.offline.load_state_dict(resume.offline_source)


@contextlib.asynccontextmanager
async def open_engines(
    engine: EngineConfig,
    rollout: RolloutConfig,
    train: TrainConfig,
    sync: SyncConfig,
    plan: RunPlan,
    parts: RunParts,
    *,
    in_place_updates: bool,
) -> AsyncIterator[RolloutEngines | None]:
    """The run's engines, started (or attached to) for the run and stopped after; None for a train-only run.

    External engines serve whatever they last loaded: they are given this run's starting weights first."""
    if plan.train_only:
        yield None
        return
    start = model_dir(parts.files, plan.base_model)
    async with start_rollout(
        engine,
        rollout,
        model_dir=start,
        # engines report it as weight_version, so the first tokens carry the resumed run's version
        weight_version=str(parts.version.engines),
        seed=plan.seed,
        log_dir=parts.files.run_dir / "logs",
        trainer_gpus=trainer_gpus(train, rollout_only=plan.rollout_only),
        colocate=sync.colocate,
        in_place_updates=in_place_updates,
    ) as engines:
        if engines.plan.backend == "external":
            await load_initial_weights(engines.pools.default, start, str(parts.version.engines))
        yield engines


def build_sync(
    sync: SyncConfig, plan: RunPlan, *, pool: WorkerPool | None, trainer: Trainer | None, run_dir: Path
) -> WeightSync:
    """The weight sync of the sync section (``slime.sync``); ``NoWeightSync`` unless both the trainer and
    the engines run. A disk sync writes under ``weights_dir``, by default ``RUN_DIR/weights``."""
    if not plan.syncs:
        return NoWeightSync()
    assert (
        pool is not None and trainer is not None
    )  # engines run unless train-only, a trainer is built unless rollout-only
    return build_weight_sync(sync, pool=pool, trainer=trainer, weights_dir=sync.weights_dir or str(run_dir / "weights"))


def eval_kwargs(rollout: RolloutConfig, inputs: RunInputs, pool: WorkerPool | None) -> dict[str, object]:
    """``slime.loop.evaluate.evaluate``'s keyword arguments for the run's evals (the eval sampling flags)."""
    return dict(
        pool=pool,
        tokenize=inputs.tokenize,
        decode=inputs.decode,
        reward_fn=inputs.reward_fn,
        generate_fn=inputs.generate_fn,
        max_response_len=rollout.resolved_eval_max_response_len,
        reward_timeout_s=rollout.reward_timeout_s,
        temperature=rollout.eval_temperature,
        top_p=rollout.resolved_eval_top_p,
        top_k=rollout.resolved_eval_top_k,
        n_samples_per_prompt=rollout.n_samples_per_eval_prompt,
        reward_key=rollout.reward_key,
    )


@dataclasses.dataclass
class SchedulerWiring:
    """What a scheduler builder of ``SCHEDULERS`` is given: the sections it reads and the parts it drives."""

    loop: LoopConfig
    rollout: RolloutConfig
    data: DataConfig
    plan: RunPlan
    parts: RunParts
    pool: WorkerPool | None
    teacher: TeacherScorer | None
    tracer: Tracer | NullTracer
    task_group: asyncio.TaskGroup


def _replay(w: SchedulerWiring) -> RolloutScheduler:
    """Train-only: each step's recorded groups, no engine."""
    if w.plan.replay_template is None:  # Config.check_run_modes refuses this
        raise ConfigError("--debug-train-only needs --load-debug-rollout-data (the recorded groups to train on)")
    return ReplayScheduler(w.loop, w.plan.replay_template, buffer=w.parts.buffer, version=w.parts.version)


def _rollout_function(w: SchedulerWiring) -> RolloutScheduler:
    """``--rollout-function-path``: one call of the user's function makes each step's groups."""
    from slime.rollout.slime_compat import RolloutArgs

    assert w.pool is not None and w.rollout.rollout_function_path is not None  # engines run unless train-only
    inputs, version = w.parts.inputs, w.parts.version
    args = RolloutArgs(
        w.rollout,
        w.loop,
        w.data,
        hf_checkpoint=w.plan.base_model,
        seed=w.plan.seed,
        pool=w.pool,
        engine_version=version.engines,
    )
    return RolloutFunctionScheduler(
        w.loop,
        w.rollout,
        load_function(w.rollout.rollout_function_path, flag="--rollout-function-path"),
        args=args,
        source=inputs.source,
        tokenize=inputs.tokenize,
        buffer=w.parts.buffer,
        reward_fn=inputs.reward_fn,
        pool=w.pool,
        version=version,
        fill_logprobs=not w.plan.megatron,
    )


def _generate(w: SchedulerWiring) -> RolloutScheduler:
    """The engines generate and rewards score (``slime.loop.scheduler``); rollout-only: at a fixed version."""
    if note := builtin_rollout_note(w.rollout.rollout_function_path, w.loop.mode):
        log.info(note)
    assert w.pool is not None  # engines run unless train-only
    inputs = w.parts.inputs
    return Scheduler(
        w.loop,
        w.rollout,
        source=inputs.source,
        tokenize=inputs.tokenize,
        decode=inputs.decode,
        pool=w.pool,
        buffer=w.parts.buffer,
        reward_fn=inputs.reward_fn,
        task_group=w.task_group,
        version=w.parts.version,
        group_filter=_group_filter(w.loop),
        tracer=w.tracer,
        generate_fn=inputs.generate_fn,
        offline=inputs.offline,
        fixed_weights=w.plan.rollout_only,  # rollout-only: the version never moves, so no admission bound
        teacher=w.teacher,
    )


def _group_filter(loop: LoopConfig) -> Callable[[Group], bool] | None:
    path = loop.dynamic_sampling_filter_path
    return load_function(path, flag="--dynamic-sampling-filter-path") if path else None


SCHEDULERS: dict[SchedulerKind, Callable[[SchedulerWiring], RolloutScheduler]] = {
    "generate": _generate,
    "rollout_function": _rollout_function,
    "replay": _replay,
}
"""``RunPlan.scheduler`` -> the builder of the scheduler that makes the run's groups (module doc)."""


def build_scheduler(w: SchedulerWiring) -> RolloutScheduler:
    """The run's scheduler from ``SCHEDULERS``, its resumable counters restored on a resume."""
    sched = SCHEDULERS[w.plan.scheduler](w)
    if (resume := w.parts.files.resume) is not None:
        # restored ids and counts: new group ids never collide with the checkpointed groups'
        sched.restore_counters(
            next_group_id=resume.next_group_id, num_admitted=resume.num_admitted, rollout_id=resume.rollout_id
        )
    return sched


def train_step_of(parts: RunParts, plan: RunPlan) -> Callable[[list[Group]], TrainMetrics] | None:
    """The step's train call: ``trainer.train_step``, or with samples that may lack rollout logprobs
    (offline data, a replay, a rollout function) ``with_offline_logprobs``; None: rollout-only."""
    if parts.trainer is None:
        return None
    # samples not generated by this run's engines may lack rollout logprobs: filled before training
    fill = parts.inputs.offline is not None or plan.scheduler != "generate"
    return with_offline_logprobs(parts.trainer) if fill else parts.trainer.train_step


async def close_parts(parts: RunParts, plan: RunPlan) -> None:
    """After the engines stopped: the reward function's client (when it has ``close``) and the megatron
    trainer, which releases the other torchrun ranks."""
    if hasattr(parts.inputs.reward_fn, "close"):
        await parts.inputs.reward_fn.close()
    if plan.megatron:
        from slime.train.megatron.trainer import MegatronTrainer

        if isinstance(parts.trainer, MegatronTrainer):
            await asyncio.to_thread(parts.trainer.close)
