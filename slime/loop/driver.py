"""The run driver: one RL run, assembled, then driven. ``run_training`` reads as its four phases::

    validate    config.validate(), check_run_modes(), the lr schedule, run_plan (slime.loop.plan)
    build       open_run, build_inputs, build_trainer, build_buffer, restore, open_engines, build_sync,
                build_scheduler (slime.loop.assemble: each part from its config sections)
    run steps   run_steps(RLMode(...)) (slime.loop.run, slime.loop.rl_mode), then the final eval
    summarise   rl_summary, summary.json and report.txt (finish_run), the something-trained check

One rollout step is ``slime.loop.step.run_step`` (``--num-rollout`` of them); evaluation runs
before the first and after the last, with generation paused. The run's evals, its per-step part of the
skeleton and its summary are ``slime.loop.rl_mode``.

Two one-sided modes (THUDM/slime's debug flags, ``slime.loop.record``):

- rollout only (``--debug-rollout-only``, ``slime rollout``): no trainer is built; the scheduler runs
  without admission bound (the version never moves), groups are rewarded and, with
  ``--save-debug-rollout-data``, recorded; no weight sync; eval runs once, before.
- train only (``--load-debug-rollout-data``, ``--debug-train-only``): no engine is launched and nothing
  is generated; each step trains on that step's recorded groups; no weight sync, no eval.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from slime.config import Config, LoopConfig, RolloutConfig, TrainConfig
from slime.loop.assemble import (
    RunParts,
    SchedulerWiring,
    build_buffer,
    build_scheduler,
    build_sync,
    build_trainer,
    close_parts,
    eval_kwargs,
    megatron_rank_served,
    model_dir,
    open_engines,
    restore,
    resumed_version,
    train_step_of,
)
from slime.loop.inputs import build_inputs, teacher_scorer
from slime.loop.outputs import check_something_trained, write_final_model
from slime.loop.plan import RunPlan, run_plan
from slime.loop.rl_mode import RLEval, RLMode, rl_summary
from slime.loop.run import RunFiles, finish_run, holds_run_folders, open_run, run_steps
from slime.obs.observers import Observers
from slime.step_record import RunSummary
from slime.types import RewardFn

__all__ = ["run_training"]

log = logging.getLogger(__name__)


@holds_run_folders  # one run per run folder (slime.loop.run_lock)
async def run_training(config: Config, *, reward_fn: RewardFn | None = None, progress: bool = True) -> RunSummary:
    """Run a whole RL job (or resume one with ``config.load``); returns the summary also written
    to ``RUN_DIR/summary.json``. See ``slime.loop.checkpoint`` for what a resume restores.

    Validate, plan, build the parts, drive the steps over the engines, summarise."""
    config.validate()
    config.check_run_modes()
    given = config  # RUN_DIR/config.json: as given (a --load resolves the lr schedule again, over its --num-rollout)
    # before the trainer is built: its lr schedule spans the run's optimizer steps
    config = msgspec.structs.replace(config, train=_lr_scheduled(config.train, config.loop, config.rollout))
    plan = run_plan(
        config.debug, config.rollout, config.train, config.engine, config.sync, seed=config.seed, run_dir=config.run_dir
    )
    # before the run folder and engines: only rank 0 builds them, the other ranks serve its train steps
    if await megatron_rank_served(
        config.train, plan, resumes=bool(config.save_interval or config.load), kwargs=config.trainer_kwargs()
    ):
        return {}  # a torchrun rank other than 0: it served rank 0's train steps until the run ended
    parts = await _build_parts(config, plan, reward_fn, given=given)
    await _drive(config, plan, parts, progress=progress)
    # before close_parts: a megatron trainer's other ranks take part in gathering the weights
    model = await asyncio.to_thread(write_final_model, parts.trainer, parts.files.run_dir)
    await close_parts(parts, plan)
    return await _summarise(parts, plan, config.loop, num_eval_prompts=config.data.num_eval_prompts, model_dir=model)


async def _build_parts(config: Config, plan: RunPlan, reward_fn: RewardFn | None, *, given: Config) -> RunParts:
    """The run folder (``given`` its ``config.json``), inputs, trainer and buffer, restored from the checkpoint on a
    resume."""
    files = open_run(config.run_dir, config.load, "trained_groups.jsonl", given)
    # the checkpoint's version (0 on a fresh run): the trainer and the scheduler start from it
    version = resumed_version(files)
    inputs = await build_inputs(config.data, config.rollout, config.loop, plan, reward_fn=reward_fn)
    start_from = model_dir(files, plan.base_model)  # the checkpoint's weights on a resume, else the base model
    trainer = await build_trainer(
        config.train, plan, start_from=start_from, version=version, kwargs=config.trainer_kwargs()
    )
    parts = RunParts(files, version, inputs, trainer, build_buffer(config.loop))
    await restore(parts)
    return parts


async def _drive(config: Config, plan: RunPlan, parts: RunParts, *, progress: bool) -> None:
    """Open the observers and the engines, then run every step and the final eval over them."""
    files, run_config = parts.files, msgspec.to_builtins(config)
    obs_ = Observers(
        config.obs, files.run_dir, num_steps=config.loop.num_rollout, run_config=run_config, progress=progress
    )
    engines_ = open_engines(
        config.engine,
        config.rollout,
        config.train,
        config.sync,
        plan,
        parts,
        in_place_updates=config.updates_in_place(),
    )
    async with obs_ as obs, engines_ as engines:
        pool = engines.pools.default if engines else None  # the actor's; engines.pools[model] for other models
        teacher = teacher_scorer(engines, use_opd=config.train.use_opd, opd_kl_coef=config.train.opd_kl_coef)
        sync = build_sync(config.sync, plan, pool=pool, trainer=parts.trainer, run_dir=files.run_dir)
        evaluator = RLEval(
            files, obs, parts.inputs.eval_sets, parts.version, eval_kwargs(config.rollout, parts.inputs, pool)
        )
        if files.resume is None and config.loop.skip_eval_before_train:
            log.info("--skip-eval-before-train: no eval before the first step")
        async with asyncio.TaskGroup() as tg:  # the scheduler's producers live in it; the steps consume
            wiring = SchedulerWiring(
                config.loop, config.rollout, config.data, plan, parts, pool, teacher, obs.tracer, tg
            )
            sched = build_scheduler(wiring)
            obs.watch(pool=pool, buffer=parts.buffer, groups_per_step=config.loop.rollout_batch_size)
            mode = RLMode(
                sched, evaluator, parts, plan, train_step=train_step_of(parts, plan), sync=sync, tracer=obs.tracer
            )
            loop = config.loop
            await run_steps(
                mode,
                files,
                obs,
                num_steps=loop.num_rollout,
                eval_interval=loop.eval_interval,
                save_interval=config.save_interval,
                eval_before=not loop.skip_eval_before_train,
            )
            # before the task group exits: its group tasks end (aborted, kept as partials) instead of being awaited
            await sched.shutdown()
        await sync.close()
        obs.progress.close()
        # rollout-only: the weights never moved, so the eval before stands for the final one
        await evaluator.final(config.loop.num_rollout, reuse_before=plan.rollout_only)


def _lr_scheduled(train: TrainConfig, loop: LoopConfig, rollout: RolloutConfig) -> TrainConfig:
    """``train`` with its lr schedule resolved over the run's optimizer steps (``--lr-warmup-fraction``,
    Megatron's default decay)."""
    from slime.train.lr_schedule import resolve_lr_schedule

    # one optimizer step per global_batch_size samples, over every sample of the run
    steps = loop.num_rollout * loop.rollout_batch_size * rollout.n_samples_per_prompt // train.global_batch_size
    return resolve_lr_schedule(train, steps)


async def _summarise(
    parts: RunParts, plan: RunPlan, loop: LoopConfig, *, num_eval_prompts: int, model_dir: str | None
) -> RunSummary:
    """The run's summary (``rl_summary`` + the data counts + ``model_dir``, the final model when the run trained),
    written with the report (``finish_run``).

    Raises:
        RunError: the run trained nothing (``check_something_trained``), after every file is written.
    """
    files: RunFiles = parts.files
    files.metrics.close()  # closed first: no record is written after the summary is taken from them
    summary = rl_summary(
        files.metrics.records,
        num_eval_prompts=num_eval_prompts,
        num_rollout=loop.num_rollout,
        mode=loop.mode,
        version=parts.version.engines,
        buffer=parts.buffer,
        wall_time_s=files.seconds(),
        trained=not plan.rollout_only,
    )
    summary.update(parts.inputs.data_counts)
    if model_dir is not None:
        summary["model_dir"] = model_dir
    await asyncio.to_thread(finish_run, files, summary)
    # after finish_run: a run that trained nothing still leaves its summary and report
    check_something_trained(files.metrics.records, trains=not plan.rollout_only, run_dir=files.run_dir)
    return summary
