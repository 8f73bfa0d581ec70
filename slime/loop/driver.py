"""The run driver: wires data, engines, scheduler, trainer and weight sync into one RL run.

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
import contextlib
import functools
import logging
from typing import Any

import msgspec

from slime.config import Config, TrainConfig
from slime.config.rollout import builtin_rollout_note
from slime.config.root import TrainerKwargs
from slime.data.dataset import PromptSource, prompt_length_check
from slime.data.sft import model_context_len
from slime.engines.fleet.host import trainer_gpus
from slime.engines.fleet.start import load_initial_weights, start_rollout
from slime.errors import ConfigError
from slime.hf_checkpoint import load_tokenizer
from slime.loop.buffer import DataBuffer
from slime.loop.checkpoint import load_checkpoint
from slime.loop.inputs import (
    generate_function,
    load_prompts,
    offline_source,
    prompt_tokenizer,
    reward_function,
    teacher_scorer,
    with_offline_logprobs,
)
from slime.loop.interface import RolloutScheduler
from slime.loop.outputs import check_something_trained
from slime.loop.record import NoWeightSync, ReplayScheduler
from slime.loop.rl_mode import RLEval, RLMode, rl_summary
from slime.loop.rollout_function import RolloutFunctionScheduler
from slime.loop.run import finish_run, holds_run_folders, open_run, run_steps
from slime.loop.scheduler import Scheduler
from slime.loop.version import PolicyVersion
from slime.obs.observers import Observers
from slime.rollout.rewards import load_function
from slime.sync import WeightSync, build_weight_sync
from slime.train.interface import Trainer
from slime.types import RewardFn

__all__ = ["run_training"]

log = logging.getLogger(__name__)


@holds_run_folders  # one run per run folder (slime.loop.run_lock)
async def run_training(config: Config, *, reward_fn: RewardFn | None = None, progress: bool = True) -> dict[str, Any]:
    """Run a whole RL job (or resume one with ``config.load``); returns the summary also written
    to ``RUN_DIR/summary.json``. See ``slime.loop.checkpoint`` for what a resume restores."""
    from transformers import AutoConfig

    from slime.train.lr_schedule import resolve_lr_schedule

    config.validate()
    config.check_run_modes()
    steps = config.loop.num_rollout * config.loop.rollout_batch_size * config.rollout.n_samples_per_prompt // config.train.global_batch_size
    config = msgspec.structs.replace(
        config, train=resolve_lr_schedule(config.train, steps)
    )  # --lr-warmup-fraction, Megatron's default decay
    rollout_only, train_only = config.debug.debug_rollout_only, config.debug.train_only
    if rollout_only and not config.debug.save_debug_rollout_data:
        log.warning("--debug-rollout-only without --save-debug-rollout-data: the rollouts are not kept (metrics only)")
    megatron = config.train.train_backend == "megatron"
    if megatron:
        from slime.train.megatron.trainer import MegatronTrainer, serve_if_worker

        if config.save_interval or config.load:
            raise ConfigError("--save-interval / --load: checkpoint and resume are not implemented for --train-backend megatron yet")
        train_cfg = msgspec.structs.replace(config.train, ref_load=config.train.ref_load or config.engine.hf_checkpoint)
        if await asyncio.to_thread(serve_if_worker, train_cfg, model_dir=config.engine.hf_checkpoint, **config.trainer_kwargs()):
            return {}  # a torchrun rank other than 0: it served rank 0's train steps until the run ended
    files = open_run(config.run_dir, config.load, "trained_groups.jsonl", config)
    ckpt, resume = files.checkpoint, files.resume
    if resume is not None:
        log.info("resuming from %s (step %d, policy version %d)", ckpt, resume.step, resume.policy_version)
    base_model = config.engine.hf_checkpoint
    model_dir = str(ckpt / "model") if ckpt else base_model
    version = PolicyVersion(resume.policy_version if resume else 0)
    tokenizer = await asyncio.to_thread(load_tokenizer, base_model, flag="--hf-checkpoint")
    if config.train.use_opd and config.engine.opd_teacher_load:
        from slime.rollout.opd import check_same_vocab

        teacher_tokenizer = await asyncio.to_thread(load_tokenizer, config.engine.opd_teacher_load, flag="--opd-teacher-load")
        check_same_vocab(tokenizer, teacher_tokenizer, student_name=base_model, teacher_name=config.engine.opd_teacher_load)
    if config.data.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"--apply-chat-template: the tokenizer in {base_model} has no chat template (no chat_template in tokenizer_config.json, "
            "no chat_template.jinja); use a model that has one (e.g. an -Instruct model), or drop --apply-chat-template to tokenize the raw prompt text"
        )
    tokenize = prompt_tokenizer(tokenizer, apply_chat_template=config.data.apply_chat_template)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    reward_fn = reward_fn or reward_function(config.rollout, builtin=config.data.builtin_task)
    generate_fn = generate_function(config.rollout.custom_generate_function_path, tokenizer)
    data_counts: dict[str, int] = {}
    needs_label = getattr(reward_fn, "needs_label", False) and not train_only  # a train-only run rewards nothing
    max_len = model_context_len(await asyncio.to_thread(AutoConfig.from_pretrained, base_model))
    bound: dict[str, Any] = dict(max_len=max_len or None)  # the engine would refuse longer prompts
    ctx = config.rollout.rollout_max_context_len
    if ctx is not None and (not max_len or ctx < max_len):
        bound = dict(max_len=ctx, context="the rollout context", source="--rollout-max-context-len")
    max_prompt_len = config.data.rollout_max_prompt_len
    check = prompt_length_check(tokenize, max_prompt_len=max_prompt_len, **bound) if bound["max_len"] or max_prompt_len else None
    train_rows, eval_sets = await asyncio.to_thread(
        functools.partial(load_prompts, by_name=True), config.data, data_counts, seed=config.seed, require_label=needs_label, check=check
    )
    eval_sets = {} if train_only else eval_sets
    source = PromptSource(
        train_rows, shuffle=config.data.rollout_shuffle, seed=config.seed, curriculum=config.data.curriculum_key is not None
    )
    offline = (
        await asyncio.to_thread(
            offline_source,
            config.data,
            config.loop,
            tokenize,
            tokenizer,
            n_samples_per_prompt=config.rollout.n_samples_per_prompt,
            megatron=megatron,
            seed=config.seed,
        )
        if config.data.offline_data and not train_only
        else None
    )
    train_cfg = msgspec.structs.replace(config.train, ref_load=config.train.ref_load or base_model)
    trainer: Trainer | None = (
        None
        if rollout_only
        else await asyncio.to_thread(
            _build_trainer,
            train_cfg,
            megatron=megatron,
            model_dir=model_dir,
            policy_version=version.trainer,
            kwargs=config.trainer_kwargs(),
        )
    )
    lp = config.loop
    buffer = DataBuffer(
        buffer_filter=load_function(lp.buffer_filter_path, flag="--buffer-filter-path") if lp.buffer_filter_path else None,
        capacity=lp.buffer_capacity,
        # expire over-stale partial groups only under --staleness-policy drop; with mask
        # their old tokens are masked and their new tokens still train
        max_staleness=lp.max_staleness if lp.staleness_policy == "drop" else None,
    )
    group_filter = (
        load_function(lp.dynamic_sampling_filter_path, flag="--dynamic-sampling-filter-path") if lp.dynamic_sampling_filter_path else None
    )
    if ckpt is not None and resume is not None:  # both or neither (open_run_dir)
        await asyncio.to_thread(load_checkpoint, ckpt, trainer=trainer)
        source.load_state_dict(resume.source)
        buffer.restore(
            ready=resume.ready, partial=resume.partial, taken=resume.taken, num_evicted=resume.num_evicted, num_expired=resume.num_expired
        )
        if offline is not None and resume.offline_source is not None:
            offline.load_state_dict(resume.offline_source)
    weights_dir = config.sync.weights_dir or str(files.run_dir / "weights")

    async with (
        Observers(
            config.obs, files.run_dir, num_steps=config.loop.num_rollout, run_config=msgspec.to_builtins(config), progress=progress
        ) as obs,
        _no_engines()
        if train_only
        else start_rollout(
            config.engine,
            config.rollout,
            model_dir=model_dir,
            weight_version=str(version.engines),
            seed=config.seed,
            log_dir=files.run_dir / "logs",
            trainer_gpus=trainer_gpus(config.train, rollout_only=rollout_only),
            colocate=config.sync.colocate,
            in_place_updates=config.updates_in_place(),
        ) as engines,
    ):
        pool = engines.pools.default if engines else None  # the actor's; engines.pools[model] for other models of --sglang-config
        # external engines serve whatever they last loaded: give them this run's policy
        if engines and pool is not None and engines.plan.backend == "external":
            await load_initial_weights(pool, model_dir, str(version.engines))
        tracer = obs.tracer
        teacher = teacher_scorer(engines, use_opd=config.train.use_opd, opd_kl_coef=config.train.opd_kl_coef)
        sync: WeightSync = NoWeightSync()
        if not (train_only or rollout_only):
            assert pool is not None and trainer is not None  # engines run unless train-only, a trainer is built unless rollout-only
            sync = build_weight_sync(config.sync, pool=pool, trainer=trainer, weights_dir=weights_dir)
        r = config.rollout
        evaluator = RLEval(
            files,
            obs,
            eval_sets,
            version,
            dict(
                pool=pool,
                tokenize=tokenize,
                decode=decode,
                reward_fn=reward_fn,
                generate_fn=generate_fn,
                max_response_len=r.resolved_eval_max_response_len,
                reward_timeout_s=r.reward_timeout_s,
                temperature=r.eval_temperature,
                top_p=r.resolved_eval_top_p,
                top_k=r.resolved_eval_top_k,
                n_samples_per_prompt=r.n_samples_per_eval_prompt,
                reward_key=r.reward_key,
            ),
        )
        if resume is None and config.loop.skip_eval_before_train:
            log.info("--skip-eval-before-train: no eval before the first step")
        async with asyncio.TaskGroup() as tg:
            sched: RolloutScheduler
            if train_only:  # recorded groups, no engine
                if (template := config.debug.load_debug_rollout_data) is None:  # Config.check_run_modes refuses this
                    raise ConfigError("--debug-train-only needs --load-debug-rollout-data (the recorded groups to train on)")
                sched = ReplayScheduler(config.loop, template, buffer=buffer, version=version)
            elif config.rollout.uses_rollout_function and (fn_path := config.rollout.rollout_function_path) is not None:
                # --rollout-function-path: one call makes each step's groups
                from slime.rollout.slime_compat import RolloutArgs

                assert pool is not None  # engines run unless train-only

                sched = RolloutFunctionScheduler(
                    config.loop,
                    config.rollout,
                    load_function(fn_path, flag="--rollout-function-path"),
                    args=RolloutArgs(
                        config.rollout,
                        config.loop,
                        config.data,
                        hf_checkpoint=config.engine.hf_checkpoint,
                        seed=config.seed,
                        pool=pool,
                        engine_version=version.engines,
                    ),
                    source=source,
                    tokenize=tokenize,
                    buffer=buffer,
                    reward_fn=reward_fn,
                    pool=pool,
                    version=version,
                    fill_logprobs=not megatron,
                )
            else:
                if note := builtin_rollout_note(config.rollout.rollout_function_path, config.loop.mode):
                    log.info(note)
                assert pool is not None  # engines run unless train-only
                sched = Scheduler(
                    config.loop,
                    config.rollout,
                    source=source,
                    tokenize=tokenize,
                    decode=decode,
                    pool=pool,
                    buffer=buffer,
                    reward_fn=reward_fn,
                    task_group=tg,
                    version=version,
                    group_filter=group_filter,
                    tracer=tracer,
                    generate_fn=generate_fn,
                    offline=offline,
                    fixed_weights=rollout_only,
                    teacher=teacher,
                )
            fill = offline is not None or train_only or config.rollout.uses_rollout_function  # samples that may lack rollout logprobs
            train_step = None if trainer is None else with_offline_logprobs(trainer) if fill else trainer.train_step  # None: rollout-only
            if resume is not None:
                sched.restore_counters(next_group_id=resume.next_group_id, num_admitted=resume.num_admitted, rollout_id=resume.rollout_id)
            obs.watch(pool=pool, buffer=buffer)
            mode = RLMode(
                sched,
                evaluator,
                trainer=trainer,
                train_step=train_step,
                sync=sync,
                tracer=tracer,
                source=source,
                offline=offline,
                colocate=config.sync.colocate and not (train_only or rollout_only),
                record_template=config.debug.save_debug_rollout_data,
                rollout_only=rollout_only,
            )
            await run_steps(
                mode,
                files,
                obs,
                num_steps=config.loop.num_rollout,
                eval_interval=config.loop.eval_interval,
                save_interval=config.save_interval,
                eval_before=not config.loop.skip_eval_before_train,
            )
            await sched.shutdown()
        await sync.close()
        obs.progress.close()
        await evaluator.final(config.loop.num_rollout, reuse_before=rollout_only)
    if hasattr(reward_fn, "close"):
        await reward_fn.close()
    if megatron and isinstance(trainer, MegatronTrainer):
        await asyncio.to_thread(trainer.close)  # releases the other torchrun ranks
    files.metrics.close()
    summary = rl_summary(
        files.metrics.records,
        num_eval_prompts=config.data.num_eval_prompts,
        num_rollout=config.loop.num_rollout,
        mode=config.loop.mode,
        version=version.engines,
        buffer=buffer,
        wall_time_s=files.seconds(),
        trained=not rollout_only,
    )
    summary.update(data_counts)
    await asyncio.to_thread(finish_run, files, summary)
    check_something_trained(files.metrics.records, trains=not rollout_only, run_dir=files.run_dir)  # RunError, after every file is written
    return summary


def _build_trainer(config: TrainConfig, *, megatron: bool, model_dir: str, policy_version: int, kwargs: TrainerKwargs) -> Trainer:
    """The run's trainer (blocking: loads ``model_dir``): ``MegatronTrainer`` with ``megatron``, else ``TorchTrainer``."""
    if megatron:
        from slime.train.megatron.trainer import MegatronTrainer

        return MegatronTrainer(config, model_dir=model_dir, policy_version=policy_version, **kwargs)
    from slime.train.torch_backend import TorchTrainer

    return TorchTrainer(config, model_dir=model_dir, policy_version=policy_version, **kwargs)


@contextlib.asynccontextmanager
async def _no_engines():
    """The engines of a train-only run: none."""
    yield None
