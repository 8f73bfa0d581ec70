"""The run driver: wires data, engines, scheduler, trainer and weight sync into one RL run.

One rollout step is ``slime.loop.step.run_step`` (``--num-rollout`` of them); evaluation runs
before the first and after the last, with generation paused.

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
import inspect
import logging
import time
from pathlib import Path
from typing import Any

import msgspec

from slime.config import Config
from slime.data.dataset import PromptRow, PromptSource, load_prompt_file, prompt_length_check
from slime.data.offline import OfflineSource, load_offline_data
from slime.data.sft import model_context_len
from slime.errors import ConfigError
from slime.hf_checkpoint import load_tokenizer
from slime.loop.buffer import DataBuffer
from slime.loop.checkpoint import LoopState, load_checkpoint, open_run_dir, save_checkpoint
from slime.loop.evaluate import evaluate_datasets
from slime.loop.record import NoWeightSync, ReplayScheduler, save_rollout_record
from slime.loop.report import JsonlLog, MetricsWriter, check_something_trained, format_step_line, write_json_atomic
from slime.loop.rollout_function import SFT_ROLLOUT, RolloutFunctionScheduler, builtin_rollout_note, check_rollout_function_modes, uses_rollout_function
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.obs.observers import Observers
from slime.obs.plots import write_plots
from slime.rollout.generate import generate as default_generate
from slime.engines.fleet.start import load_initial_weights, start_rollout
from slime.rollout.rewards import load_function
from slime.engines.fleet.plan import trainer_gpus, updates_in_place
from slime.sync import build_weight_sync

__all__ = ["run_training", "load_prompts", "check_run_modes", "prompt_tokenizer"]

log = logging.getLogger(__name__)


def _clock(t_start: float, t_eval: float) -> dict[str, float]:
    """An eval record's ``time_s`` (seconds since the run started, at its end) and ``eval_time_s`` (its own
    duration, pauses included), so accuracy can be read against wall time with and without evals."""
    now = time.monotonic()
    return {"time_s": round(now - t_start, 4), "eval_time_s": round(now - t_eval, 4)}


def _builtin_task(config: Config) -> Any:
    """The module of ``--builtin-task``: ``slime.data.arith``, ``slime.data.calc`` or ``slime.data.chain``."""
    import importlib

    return importlib.import_module(f"slime.data.{config.data.builtin_task}")


def load_prompts(config: Config, counts: dict[str, int] | None = None, *, require_label: bool = False,
                 check: Any = None, by_name: bool = False) -> tuple[list[PromptRow], Any]:
    """Train and eval prompt rows: the user's JSONL files, or the built-in task (``--builtin-task``).

    The eval rows are one list (every dataset's, in order), or with ``by_name`` a dict ``{name: rows}``
    of ``--eval-prompt-data``'s datasets (name None: one unnamed path, or the built-in eval split; empty:
    no eval), each cut to ``--num-eval-prompts``.

    ``counts``, when given, receives ``bad_data_lines_skipped`` (``--on-bad-data skip``).
    ``require_label``: the reward reads labels (its ``needs_label``); rows without one are bad rows.
    ``check``: a per-row check of the files' rows (``load_prompt_file``), e.g. ``prompt_length_check``."""
    num_bad = [0, 0]
    d = config.data
    kw = dict(input_key=d.input_key, label_key=d.label_key, metadata_key=d.metadata_key, on_bad_data=d.on_bad_data,
              tool_key=d.tool_key, apply_chat_template=d.apply_chat_template, require_label=require_label, check=check)
    if d.prompt_data:
        train, num_bad[0] = load_prompt_file(d.prompt_data, flag="--prompt-data", curriculum_key=d.curriculum_key, **kw)
    else:
        task = _builtin_task(config)
        train = [PromptRow(index=i, prompt=r["prompt"], label=r["label"]) for i, r in enumerate(task.generate_dataset(20000, seed=config.seed, split="train"))]
    sets: dict[str | None, list[PromptRow]] = {}
    for name, path in d.eval_datasets:
        rows, bad = load_prompt_file(path, flag="--eval-prompt-data", **kw)
        num_bad[1] += bad
        sets[name] = rows[: d.num_eval_prompts]
    if not d.eval_datasets and not d.prompt_data:
        task = _builtin_task(config)
        # a fixed held-out set (seed 0), the same for every run seed, so runs compare
        sets[None] = [PromptRow(index=i, prompt=r["prompt"], label=r["label"]) for i, r in enumerate(task.generate_dataset(d.num_eval_prompts, seed=0, split="eval"))]
    if counts is not None:
        counts["bad_data_lines_skipped"] = sum(num_bad)
    return train, sets if by_name else [r for rows in sets.values() for r in rows]


def check_run_modes(config: Config) -> None:
    """Checks across sections of the data and debug modes, at start (each section's own checks: ``Config.validate``).

    Raises:
        ConfigError: naming the flags.
    """
    d, dbg, r = config.data, config.debug, config.rollout
    problems = [
        (dbg.debug_train_only and dbg.load_debug_rollout_data is None and config.train.loss_type != "sft_loss",
         "--debug-train-only needs --load-debug-rollout-data (the recorded groups to train on)"),
        (config.rollout.rollout_function_path == SFT_ROLLOUT and config.train.loss_type != "sft_loss",
         f"--rollout-function-path={SFT_ROLLOUT} is THUDM/slime's SFT: pass --loss-type sft_loss"),
        (config.loop.offline_ratio > 0 and d.offline_data is None, f"--offline-ratio={config.loop.offline_ratio} needs --offline-data"),
        (d.offline_data is not None and config.loop.offline_ratio == 0, "--offline-data needs --offline-ratio > 0 (the fraction of each batch it fills)"),
        (r.n_samples_per_eval_prompt > 1 and r.eval_temperature == 0,
         f"--n-samples-per-eval-prompt={r.n_samples_per_eval_prompt} needs --eval-temperature > 0 (greedy samples are all the same)"),
        (dbg.debug_rollout_only and bool(config.save_interval or config.load), "--debug-rollout-only: --save-interval / --load are not supported (nothing trains)"),
        ((dbg.debug_rollout_only or dbg.train_only) and config.train.train_backend == "megatron",
         "--debug-rollout-only / --debug-train-only / --load-debug-rollout-data: not supported with --train-backend megatron yet"),
        (not config.train.use_opd and bool(config.engine.opd_teacher_load or config.engine.opd_teacher_addrs),
         "--opd-teacher-load / --opd-teacher-addrs: a teacher is only used with --use-opd"),
        (config.train.use_opd and not (config.engine.opd_teacher_load or config.engine.opd_teacher_addrs or config.engine.sglang_config),
         "--use-opd needs a teacher: --opd-teacher-load HF_DIR, --opd-teacher-addrs host:port, or a 'teacher' group in --sglang-config"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)
    check_rollout_function_modes(config)


def prompt_tokenizer(tokenizer: Any, *, apply_chat_template: bool) -> Any:
    """The run's prompt tokenizer: ``tokenize(text_or_messages, tools=None) -> [num_prompt_tokens] ids``.

    Without ``apply_chat_template``: ``tokenizer.encode(text)`` with the tokenizer's defaults (BOS),
    as SGLang tokenizes ``text``; tools are not rendered (they stay in ``Sample.metadata["tools"]``).
    With it: text becomes ``[{"role": "user", "content": text}]``, a row's messages are used as given,
    and ``apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)``
    renders them (THUDM/slime renders its prompts the same way).
    """

    def tokenize(prompt: str | list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        if not apply_chat_template:
            return tokenizer.encode(prompt)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        out = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(out if isinstance(out, list) else out["input_ids"])

    return tokenize


async def run_training(config: Config, *, reward_fn: Any = None, progress: bool = True) -> dict[str, Any]:
    """Run a whole RL job (or resume one with ``config.load``); returns the summary also written
    to ``RUN_DIR/summary.json``. See ``slime.loop.checkpoint`` for what a resume restores."""
    from transformers import AutoConfig

    from slime.train.lr_schedule import resolve_lr_schedule
    from slime.train.torch_backend import TorchTrainer

    config.validate()
    check_run_modes(config)
    steps = config.loop.num_rollout * config.loop.rollout_batch_size * config.rollout.n_samples_per_prompt // config.train.global_batch_size
    config = msgspec.structs.replace(config, train=resolve_lr_schedule(config.train, steps))  # --lr-warmup-fraction, Megatron's default decay
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
    run_dir, ckpt, resume = open_run_dir(config.run_dir, config.load, ("metrics.jsonl", "trained_groups.jsonl"))
    if resume is not None:
        log.info("resuming from %s (step %d, policy version %d)", ckpt, resume.step, resume.policy_version)
    write_json_atomic(run_dir / "config.json", msgspec.to_builtins(config))
    base_model = config.engine.hf_checkpoint
    model_dir = str(ckpt / "model") if ckpt else base_model
    version = resume.policy_version if resume else 0
    tokenizer = await asyncio.to_thread(load_tokenizer, base_model, flag="--hf-checkpoint")
    if config.train.use_opd and config.engine.opd_teacher_load:
        from slime.rollout.opd import check_same_vocab

        teacher_tokenizer = await asyncio.to_thread(load_tokenizer, config.engine.opd_teacher_load, flag="--opd-teacher-load")
        check_same_vocab(tokenizer, teacher_tokenizer, student_name=base_model, teacher_name=config.engine.opd_teacher_load)
    if config.data.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"--apply-chat-template: the tokenizer in {base_model} has no chat template (no chat_template in tokenizer_config.json, "
                          "no chat_template.jinja); use a model that has one (e.g. an -Instruct model), or drop --apply-chat-template to tokenize the raw prompt text")
    tokenize = prompt_tokenizer(tokenizer, apply_chat_template=config.data.apply_chat_template)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    reward_fn = reward_fn or _reward_function(config)
    generate_fn = _generate_function(config, tokenizer)
    data_counts: dict[str, int] = {}
    needs_label = getattr(reward_fn, "needs_label", False) and not train_only  # a train-only run rewards nothing
    max_len = model_context_len(await asyncio.to_thread(AutoConfig.from_pretrained, base_model))
    bound = dict(max_len=max_len or None)  # the engine would refuse longer prompts
    ctx = config.rollout.rollout_max_context_len
    if ctx is not None and (not max_len or ctx < max_len):
        bound = dict(max_len=ctx, context="the rollout context", source="--rollout-max-context-len")
    max_prompt_len = config.data.rollout_max_prompt_len
    check = prompt_length_check(tokenize, max_prompt_len=max_prompt_len, **bound) if bound["max_len"] or max_prompt_len else None
    train_rows, eval_sets = await asyncio.to_thread(functools.partial(load_prompts, by_name=True), config, data_counts,
                                                    require_label=needs_label, check=check)
    eval_sets = {} if train_only else eval_sets
    num_eval_prompts = sum(map(len, eval_sets.values()))
    source = PromptSource(train_rows, shuffle=config.data.rollout_shuffle, seed=config.seed, curriculum=config.data.curriculum_key is not None)
    offline = await asyncio.to_thread(_offline_source, config, tokenize, tokenizer) if config.data.offline_data and not train_only else None
    train_cfg = msgspec.structs.replace(config.train, ref_load=config.train.ref_load or base_model)
    trainer = None if rollout_only else await asyncio.to_thread(
        MegatronTrainer if megatron else TorchTrainer, train_cfg, model_dir=model_dir, policy_version=version, **config.trainer_kwargs())
    lp = config.loop
    buffer = DataBuffer(buffer_filter=load_function(lp.buffer_filter_path, flag="--buffer-filter-path") if lp.buffer_filter_path else None,
                        capacity=lp.buffer_capacity,
                        # expire over-stale partial groups only under --staleness-policy drop; with mask
                        # their old tokens are masked and their new tokens still train
                        max_staleness=lp.max_staleness if lp.staleness_policy == "drop" else None)
    group_filter = load_function(lp.dynamic_sampling_filter_path, flag="--dynamic-sampling-filter-path") if lp.dynamic_sampling_filter_path else None
    if resume is not None:
        await asyncio.to_thread(load_checkpoint, ckpt, trainer=trainer)
        source.load_state_dict(resume.source)
        buffer.restore(ready=resume.ready, partial=resume.partial, taken=resume.taken, num_evicted=resume.num_evicted, num_expired=resume.num_expired)
        if offline is not None and resume.offline_source is not None:
            offline.load_state_dict(resume.offline_source)
    weights_dir = config.sync.weights_dir or str(run_dir / "weights")
    metrics = MetricsWriter(run_dir)
    trained_log = JsonlLog(run_dir / "trained_groups.jsonl")  # like metrics.jsonl, created by its first line
    t_start = time.monotonic()

    async with Observers(config, run_dir, progress=progress) as obs, _no_engines() if train_only else start_rollout(
        config.engine, config.rollout, model_dir=model_dir, weight_version=str(version), seed=config.seed, log_dir=run_dir / "logs",
        trainer_gpus=trainer_gpus(config), colocate=config.sync.colocate, in_place_updates=updates_in_place(config),
    ) as engines:
        pool = engines.pools.default if engines else None  # the actor's; engines.pools[model] for other models of --sglang-config
        if engines and engines.plan.backend == "external":  # they serve whatever they last loaded: give them this run's policy
            await load_initial_weights(pool, model_dir, str(version))
        tracer = obs.tracer
        teacher = _teacher(config, engines)
        sync = NoWeightSync() if train_only or rollout_only else build_weight_sync(config.sync, pool=pool, trainer=trainer, weights_dir=weights_dir)
        eval_kw = dict(
            pool=pool, tokenize=tokenize, decode=decode, reward_fn=reward_fn, generate_fn=generate_fn,
            max_response_len=config.rollout.resolved_eval_max_response_len, reward_timeout_s=config.rollout.reward_timeout_s,
            temperature=config.rollout.eval_temperature, top_p=config.rollout.resolved_eval_top_p, top_k=config.rollout.resolved_eval_top_k,
            n_samples_per_prompt=config.rollout.n_samples_per_eval_prompt,
            reward_key=config.rollout.reward_key,
        )
        before = None
        if resume is None and config.loop.skip_eval_before_train:
            log.info("--skip-eval-before-train: no eval before the first step")
        elif resume is None:
            t_eval = time.monotonic()
            with tracer.span("eval", "eval", step=0, num_prompts=num_eval_prompts):
                before = await evaluate_datasets(eval_sets, engine_version=version, **eval_kw)
            metrics.write(rec := {"kind": "eval", "step": 0, "policy_version": 0, **before, **_clock(t_start, t_eval)})
            obs.record(rec)
            log.info("eval before RL: accuracy %.3f%s", before["accuracy"], _per_dataset(before))
        first_step = resume.step + 1 if resume else 1
        async with asyncio.TaskGroup() as tg:
            if train_only:  # recorded groups, no engine
                sched = ReplayScheduler(config.loop, config.debug.load_debug_rollout_data, buffer=buffer, engine_version=version)
            elif uses_rollout_function(config):  # --rollout-function-path: one call makes each step's groups
                sched = RolloutFunctionScheduler(config, load_function(config.rollout.rollout_function_path, flag="--rollout-function-path"),
                                                 source=source, tokenize=tokenize, buffer=buffer, reward_fn=reward_fn, pool=pool,
                                                 engine_version=version, fill_logprobs=not megatron)
            else:
                if note := builtin_rollout_note(config.rollout.rollout_function_path, config.loop.mode):
                    log.info(note)
                sched = Scheduler(
                    config.loop, config.rollout, source=source, tokenize=tokenize, decode=decode, pool=pool,
                    buffer=buffer, reward_fn=reward_fn, task_group=tg, engine_version=version, group_filter=group_filter,
                    tracer=tracer, generate_fn=generate_fn, offline=offline, fixed_weights=rollout_only, teacher=teacher,
                )
            fill = offline is not None or train_only or uses_rollout_function(config)  # samples that may lack rollout logprobs
            train_step = None if rollout_only else _with_offline_logprobs(trainer) if fill else trainer.train_step
            template = config.debug.save_debug_rollout_data

            async def on_batch(groups: list[Any]) -> None:  # --save-debug-rollout-data: the groups as taken, before masking
                await asyncio.to_thread(save_rollout_record, template, sched.rollout_id, groups, policy_version=version)
            if resume is not None:
                sched.restore_counters(next_group_id=resume.next_group_id, num_admitted=resume.num_admitted, rollout_id=resume.rollout_id)
            obs.watch(pool=pool, buffer=buffer)
            for step in range(first_step, config.loop.num_rollout + 1):
                version, groups, record = await run_step(sched, train_step=train_step, sync=sync, version=version, tracer=tracer,
                                                         colocate=config.sync.colocate and not (train_only or rollout_only),
                                                         on_batch=on_batch if template else None)
                record["step"] = step
                record["time_s"] = round(time.monotonic() - t_start, 4)
                metrics.write(record)
                for g in groups:
                    trained_log.write({"step": step, "group_id": g.group_id, "data_index": g.data_index})
                obs.record(record, format_step_line(record))
                if config.loop.eval_interval and step % config.loop.eval_interval == 0 and step < config.loop.num_rollout and eval_sets and not rollout_only:
                    t_eval = time.monotonic()
                    async with sched.paused():
                        with tracer.span("eval", "eval", step=step, num_prompts=num_eval_prompts):
                            mid = await evaluate_datasets(eval_sets, engine_version=version, **eval_kw)
                    metrics.write(rec := {"kind": "eval", "step": step, "policy_version": version, **mid, **_clock(t_start, t_eval)})
                    obs.record(rec, f"eval @ step {step}: accuracy {mid['accuracy']:.3f}{_per_dataset(mid)}")
                if config.save_interval and (step % config.save_interval == 0 or step == config.loop.num_rollout):
                    async with sched.quiesced():
                        state = LoopState(step=step, policy_version=version, source=source.state_dict(), taken=sorted(buffer.taken),
                                          ready=list(buffer.ready), partial=buffer.partial_groups(), num_evicted=buffer.num_evicted,
                                          num_expired=buffer.num_expired, offline_source=offline.state_dict() if offline else None, **sched.counters())
                        with tracer.span("checkpoint", "checkpoint", step=step):
                            await asyncio.to_thread(save_checkpoint, run_dir / "checkpoints", state, trainer=trainer)
            await sched.shutdown()
        await sync.close()
        obs.progress.close()
        t_eval = time.monotonic()
        with tracer.span("eval", "eval", step=config.loop.num_rollout, num_prompts=num_eval_prompts):
            if rollout_only and before is not None:  # the weights never changed: the eval before stands
                after = before
            else:
                after = await evaluate_datasets(eval_sets, engine_version=version, **eval_kw)
        metrics.write(rec := {"kind": "eval", "step": config.loop.num_rollout, "policy_version": version, **after, **_clock(t_start, t_eval)})
        obs.record(rec)
    metrics.close()
    trained_log.close()
    if hasattr(reward_fn, "close"):
        await reward_fn.close()
    if megatron and trainer is not None:
        await asyncio.to_thread(trainer.close)  # releases the other torchrun ranks
    summary = _summary(metrics.records, config, version=version, buffer=buffer, wall_time_s=time.monotonic() - t_start)
    summary.update(data_counts)
    write_json_atomic(run_dir / "summary.json", summary)
    await asyncio.to_thread(write_plots, metrics.records, run_dir)
    await asyncio.to_thread(_write_report, run_dir)
    check_something_trained(metrics.records, trains=not rollout_only, run_dir=run_dir)  # RunError, after every file is written
    return summary


def _per_dataset(record: dict[str, Any]) -> str:
    """`` (aime 0.200, math 0.800)``: each named eval dataset's accuracy, for the log line; empty without names."""
    named = [(key.split("/")[1], value) for key, value in record.items() if key.startswith("eval/") and key.endswith("/accuracy")]
    return f" ({', '.join(f'{name} {value:.3f}' for name, value in named)})" if named else ""


def _write_report(run_dir: Path) -> None:
    """``RUN_DIR/report.txt``: what ``slime report RUN_DIR`` prints, written at the end of the run."""
    from slime.obs.report import format_report, load_run, summarize

    rep = summarize(*load_run(run_dir))
    (run_dir / "report.txt").write_text(format_report(run_dir, rep) + "\n")


@contextlib.asynccontextmanager
async def _no_engines():
    """The engines of a train-only run: none."""
    yield None


def _teacher(config: Config, engines: Any) -> Any:
    """``--use-opd``: the scorer over the ``teacher`` pool (``slime.rollout.opd``); None without OPD or
    engines (train-only runs train on recorded teacher logprobs).

    Raises:
        ConfigError: ``--use-opd`` with no teacher engines.
    """
    if not config.train.use_opd or engines is None:
        return None
    from slime.rollout.opd import TEACHER, TeacherScorer

    if TEACHER not in engines.pools:
        raise ConfigError(f"--use-opd needs a teacher: --opd-teacher-load HF_DIR, --opd-teacher-addrs HOST:PORT, or a "
                          f"'model: {TEACHER}' group in --sglang-config (models served: {sorted(engines.pools)})")
    log.info("on-policy distillation: teacher engines %s, --opd-kl-coef %s", engines.pools[TEACHER].urls, config.train.opd_kl_coef)
    return TeacherScorer(engines.pools[TEACHER])


def _offline_source(config: Config, tokenize: Any, tokenizer: Any) -> OfflineSource:
    """``--offline-data``, tokenised (prompts as online ones; responses without special tokens)."""
    d = config.data
    groups = load_offline_data(
        d.offline_data, tokenize=tokenize, encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
        group_size=config.rollout.n_samples_per_prompt, input_key=d.input_key, label_key=d.label_key, metadata_key=d.metadata_key,
        tool_key=d.tool_key, apply_chat_template=d.apply_chat_template, on_bad_data=d.on_bad_data,
    )
    if config.train.train_backend == "megatron" and any(s.logprobs is None for g in groups for s in g.samples):
        raise ConfigError("--offline-data without 'logprobs' in every row: computing them is implemented for the torch backend only")
    log.info("offline data: %d groups from %s, %.0f%% of each batch; admission control counts %d online groups per batch",
             len(groups), d.offline_data, 100 * config.loop.offline_ratio, config.loop.online_groups_per_batch)
    return OfflineSource(groups, shuffle=d.rollout_shuffle, seed=config.seed + 1)


def _with_offline_logprobs(trainer: Any) -> Any:
    """``trainer.train_step`` that first fills the rollout logprobs of offline samples whose file had
    none (``metadata["offline_logprobs"] is False``) with the trainer's own, at the rollout
    temperature: the behaviour policy is unknown, so it is taken to be the current one (slime.data.offline)."""

    def train_step(groups: list[Any]) -> dict[str, Any]:
        todo = [s for g in groups for s in g.samples if s.metadata.get("offline") and not s.metadata.get("offline_logprobs")]
        if todo:
            import torch

            from slime.train.logprobs import compute_token_logprobs

            device = next(trainer.model.parameters()).device
            with torch.no_grad():
                for s in todo:
                    ids = torch.tensor([s.prompt_ids + s.response_ids], device=device)  # [1, T]
                    lp = compute_token_logprobs(trainer.model, ids, torch.ones_like(ids), temperature=trainer.rollout_temperature)  # [1, T-1]
                    s.rollout_logprobs[:] = lp[0, len(s.prompt_ids) - 1 :].tolist()
        return trainer.train_step(groups)

    return train_step


def _reward_function(config: Config) -> Any:
    """``--custom-rm-path``, else the verifier ``--rm-type`` names, else the built-in task's reward (``--builtin-task``)."""
    if config.rollout.custom_rm_path:
        return load_function(config.rollout.custom_rm_path)
    from slime.rollout.verifiers import reward_fn_from_config

    fn = reward_fn_from_config(config.rollout)
    if fn is not None:
        return fn
    return _builtin_task(config).reward


def _generate_function(config: Config, tokenizer: Any) -> Any:
    """``--custom-generate-function-path`` (with the tokenizer bound when it asks for one), else the default."""
    path = config.rollout.custom_generate_function_path
    if not path:
        return default_generate
    fn = load_function(path, flag="--custom-generate-function-path")
    if "tokenizer" in inspect.signature(fn).parameters:
        fn = functools.partial(fn, tokenizer=tokenizer)
    return fn


def _summary(records: list[dict[str, Any]], config: Config, *, version: int, buffer: DataBuffer, wall_time_s: float) -> dict[str, Any]:
    """The run's summary, derived from every metrics record (so a resumed run counts its whole history)."""
    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    first = evals[0] if evals and evals[0].get("step") == 0 else None  # None under --skip-eval-before-train
    opd = [r["opd/reverse_kl"] for r in steps if "opd/reverse_kl" in r]
    return {
        **({"opd_reverse_kl_first_step": opd[0], "opd_reverse_kl_last_step": opd[-1]} if opd else {}),
        "eval_accuracy_before": first["accuracy"] if first else None,  # None: no eval set (strict JSON has no NaN)
        "eval_accuracy_after": evals[-1]["accuracy"] if evals else None,
        **({f"{key}_{when}": r[key] for when, r in (("before", first), ("after", evals[-1])) if r for key in r
            if key.startswith("eval/") and key.endswith("/accuracy")} if evals else {}),  # eval/<name>/accuracy_before, ..._after
        "num_eval_prompts": config.data.num_eval_prompts,
        "num_rollout": config.loop.num_rollout,
        "final_policy_version": version,
        "wall_time_s": round(wall_time_s, 1),
        "mode": config.loop.mode,
        "partial_groups_left": buffer.num_partial,
        "ready_groups_left": buffer.num_ready,
        "groups_trained": len(buffer.taken),  # groups handed to the trainer, FAILED samples and all
        "trained_tokens": sum(r.get("trained_tokens", 0) for r in steps),  # loss-bearing tokens: 0 when nothing trained
        "aborted_samples": sum(r["aborted_samples"] for r in steps),
        "resumed_samples": sum(r["resumed_samples"] for r in steps),
        "multi_version_samples": sum(r["multi_version_samples"] for r in steps),
        "max_versions_in_a_trained_sample": max((r["max_versions_in_a_sample"] for r in steps), default=1),
        "failed_samples": sum(r["failed_samples"] for r in steps),
        "offline_groups_trained": sum(r.get("offline_groups", 0) for r in steps),
        "buffer_evicted_groups": buffer.num_evicted,
        "buffer_expired_groups": buffer.num_expired,
    }
