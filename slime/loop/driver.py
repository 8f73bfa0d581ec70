"""The run driver: wires data, engines, scheduler, trainer and weight sync into one RL run.

One rollout step is ``slime.loop.step.run_step`` (``--num-rollout`` of them); evaluation runs
before the first and after the last, with generation paused.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import time
from pathlib import Path
from typing import Any

import msgspec

from slime.config import Config
from slime.data.dataset import PromptRow, PromptSource, load_jsonl_prompts
from slime.loop.buffer import DataBuffer
from slime.loop.checkpoint import LoopState, latest_checkpoint, load_checkpoint, save_checkpoint, truncate_jsonl
from slime.loop.evaluate import evaluate
from slime.loop.report import MetricsWriter, format_step_line, write_json_atomic
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.obs.observers import Observers
from slime.obs.plots import write_plots
from slime.rollout.generate import generate as default_generate
from slime.rollout.deploy import start_rollout
from slime.rollout.rewards import load_function
from slime.sync import build_weight_sync

__all__ = ["run_training", "load_prompts"]

log = logging.getLogger(__name__)


def load_prompts(config: Config) -> tuple[list[PromptRow], list[PromptRow]]:
    """Train and eval prompt rows: the user's JSONL files, or the built-in arithmetic task."""
    d = config.data
    kw = dict(input_key=d.input_key, label_key=d.label_key, metadata_key=d.metadata_key, on_bad_data=d.on_bad_data)
    if d.prompt_data:
        train, _ = load_jsonl_prompts(d.prompt_data, flag="--prompt-data", **kw)
    else:
        from slime.data import arith

        train = [PromptRow(index=i, prompt=r["prompt"], label=r["label"]) for i, r in enumerate(arith.generate_dataset(20000, seed=d.seed, split="train"))]
    if d.eval_prompt_data:
        evals, _ = load_jsonl_prompts(d.eval_prompt_data, flag="--eval-prompt-data", **kw)
    elif not d.prompt_data:
        from slime.data import arith

        # a fixed held-out set (seed 0), the same for every run seed, so runs compare
        evals = [PromptRow(index=i, prompt=r["prompt"], label=r["label"]) for i, r in enumerate(arith.generate_dataset(d.num_eval_prompts, seed=0, split="eval"))]
    else:
        evals = []
    return train, evals[: d.num_eval_prompts]


async def run_training(config: Config, *, reward_fn: Any = None, progress: bool = True) -> dict[str, Any]:
    """Run a whole RL job (or resume one with ``config.load``); returns the summary also written
    to ``RUN_DIR/summary.json``. See ``slime.loop.checkpoint`` for what a resume restores."""
    from transformers import AutoTokenizer

    from slime.train.torch_backend import TorchTrainer

    config.validate()
    megatron = config.train.train_backend == "megatron"
    if megatron:
        from slime.train.megatron.trainer import MegatronTrainer, serve_if_worker
        from slime.errors import ConfigError

        if config.save_interval or config.load:
            raise ConfigError("--save-interval / --load: checkpoint and resume are not implemented for --train-backend megatron yet")
        train_cfg = msgspec.structs.replace(config.train, ref_load=config.train.ref_load or config.engine.hf_checkpoint)
        if await asyncio.to_thread(serve_if_worker, train_cfg, model_dir=config.engine.hf_checkpoint):
            return {}  # a torchrun rank other than 0: it served rank 0's train steps until the run ended
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = latest_checkpoint(Path(config.load) / "checkpoints") if config.load else None
    resume = msgspec.json.decode((ckpt / "loop.json").read_bytes(), type=LoopState) if ckpt else None
    if config.load and ckpt is None:
        log.warning("--load %s: no checkpoint found; starting a fresh run", config.load)
    for name in ("metrics.jsonl", "trained_groups.jsonl"):  # steps after the checkpoint are replayed
        truncate_jsonl(run_dir / name, max_step=resume.step if resume else -1)
    if resume is not None:
        log.info("resuming from %s (step %d, policy version %d)", ckpt, resume.step, resume.policy_version)
    write_json_atomic(run_dir / "config.json", msgspec.to_builtins(config))
    base_model = config.engine.hf_checkpoint
    model_dir = str(ckpt / "model") if ckpt else base_model
    version = resume.policy_version if resume else 0
    tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, base_model)
    tokenize = lambda text: tokenizer.encode(text)  # the tokenizer's defaults (BOS), as SGLang tokenizes `text`  # noqa: E731
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    reward_fn = reward_fn or _reward_function(config)
    generate_fn = _generate_function(config, tokenizer)
    train_rows, eval_rows = await asyncio.to_thread(load_prompts, config)
    source = PromptSource(train_rows, shuffle=config.data.rollout_shuffle, seed=config.data.seed)
    train_cfg = msgspec.structs.replace(config.train, ref_load=config.train.ref_load or base_model)
    trainer = await asyncio.to_thread(MegatronTrainer if megatron else TorchTrainer, train_cfg, model_dir=model_dir, policy_version=version)
    lp = config.loop
    buffer = DataBuffer(buffer_filter=load_function(lp.buffer_filter_path, flag="--buffer-filter-path") if lp.buffer_filter_path else None)
    group_filter = load_function(lp.dynamic_sampling_filter_path, flag="--dynamic-sampling-filter-path") if lp.dynamic_sampling_filter_path else None
    if resume is not None:
        await asyncio.to_thread(load_checkpoint, ckpt, trainer=trainer)
        source.load_state_dict(resume.source)
        buffer.restore(ready=resume.ready, partial=resume.partial, taken=resume.taken)
    weights_dir = config.sync.weights_dir or str(run_dir / "weights")
    metrics = MetricsWriter(run_dir)
    trained_log = (run_dir / "trained_groups.jsonl").open("a")
    t_start = time.monotonic()

    async with Observers(config, run_dir, progress=progress) as obs, start_rollout(
        config.engine, config.rollout, model_dir=model_dir, weight_version=str(version), seed=config.seed, log_dir=run_dir / "logs",
    ) as engines:
        pool = engines.pools.default  # the actor's; engines.pools[model] for other models of --sglang-config
        if resume is not None and engines.plan.backend == "external":
            await pool.update_weights_from_disk(model_dir, weight_version=str(version))  # external engines hold other weights
        tracer = obs.tracer
        sync = build_weight_sync(config.sync, pool=pool, trainer=trainer, weights_dir=weights_dir)
        eval_kw = dict(
            pool=pool, tokenize=tokenize, decode=decode, reward_fn=reward_fn,
            max_response_len=config.rollout.rollout_max_response_len, reward_timeout_s=config.rollout.reward_timeout_s,
        )
        if resume is None:
            with tracer.span("eval", "eval", step=0, num_prompts=len(eval_rows)):
                before = await evaluate(eval_rows, engine_version=version, **eval_kw) if eval_rows else {"accuracy": float("nan")}
            metrics.write(rec := {"kind": "eval", "step": 0, "policy_version": 0, **before})
            obs.record(rec)
            log.info("eval before RL: accuracy %.3f", before["accuracy"])
        first_step = resume.step + 1 if resume else 1
        async with asyncio.TaskGroup() as tg:
            sched = Scheduler(
                config.loop, config.rollout, source=source, tokenize=tokenize, decode=decode, pool=pool,
                buffer=buffer, reward_fn=reward_fn, task_group=tg, engine_version=version, group_filter=group_filter,
                tracer=tracer, generate_fn=generate_fn,
            )
            if resume is not None:
                sched.restore_counters(next_group_id=resume.next_group_id, num_admitted=resume.num_admitted, rollout_id=resume.rollout_id)
            obs.watch(pool=pool, buffer=buffer)
            for step in range(first_step, config.loop.num_rollout + 1):
                version, groups, record = await run_step(sched, train_step=trainer.train_step, sync=sync, version=version, tracer=tracer,
                                                         colocate=config.sync.colocate)
                record["step"] = step
                metrics.write(record)
                for g in groups:
                    trained_log.write(json.dumps({"step": step, "group_id": g.group_id, "data_index": g.data_index}) + "\n")
                trained_log.flush()
                obs.record(record, format_step_line(record))
                if config.loop.eval_interval and step % config.loop.eval_interval == 0 and step < config.loop.num_rollout:
                    async with sched.paused():
                        with tracer.span("eval", "eval", step=step, num_prompts=len(eval_rows)):
                            mid = await evaluate(eval_rows, engine_version=version, **eval_kw)
                    metrics.write(rec := {"kind": "eval", "step": step, "policy_version": version, **mid})
                    obs.record(rec, f"eval @ step {step}: accuracy {mid['accuracy']:.3f}")
                if config.save_interval and (step % config.save_interval == 0 or step == config.loop.num_rollout):
                    async with sched.quiesced():
                        state = LoopState(step=step, policy_version=version, source=source.state_dict(), taken=sorted(buffer.taken),
                                          ready=list(buffer.ready), partial=buffer.partial_groups(), **sched.counters())
                        with tracer.span("checkpoint", "checkpoint", step=step):
                            await asyncio.to_thread(save_checkpoint, run_dir / "checkpoints", state, trainer=trainer)
            await sched.shutdown()
        await sync.close()
        obs.progress.close()
        with tracer.span("eval", "eval", step=config.loop.num_rollout, num_prompts=len(eval_rows)):
            after = await evaluate(eval_rows, engine_version=version, **eval_kw) if eval_rows else {"accuracy": float("nan")}
        metrics.write(rec := {"kind": "eval", "step": config.loop.num_rollout, "policy_version": version, **after})
        obs.record(rec)
    metrics.close()
    trained_log.close()
    if hasattr(reward_fn, "close"):
        await reward_fn.close()
    if megatron:
        await asyncio.to_thread(trainer.close)  # releases the other torchrun ranks
    summary = _summary(metrics.records, config, version=version, buffer=buffer, wall_time_s=time.monotonic() - t_start)
    write_json_atomic(run_dir / "summary.json", summary)
    await asyncio.to_thread(write_plots, metrics.records, run_dir)
    return summary


def _reward_function(config: Config) -> Any:
    """``--custom-rm-path``, else the verifier ``--rm-type`` names, else the arithmetic task's reward."""
    if config.rollout.custom_rm_path:
        return load_function(config.rollout.custom_rm_path)
    from slime.rollout.verifiers import reward_fn_from_config

    fn = reward_fn_from_config(config.rollout)
    if fn is not None:
        return fn
    from slime.data.arith import reward

    return reward


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
    return {
        "eval_accuracy_before": evals[0]["accuracy"] if evals else float("nan"),
        "eval_accuracy_after": evals[-1]["accuracy"] if evals else float("nan"),
        "num_eval_prompts": config.data.num_eval_prompts,
        "num_rollout": config.loop.num_rollout,
        "final_policy_version": version,
        "wall_time_s": round(wall_time_s, 1),
        "mode": config.loop.mode,
        "partial_groups_left": buffer.num_partial,
        "ready_groups_left": buffer.num_ready,
        "groups_trained": len(buffer.taken),
        "aborted_samples": sum(r["aborted_samples"] for r in steps),
        "resumed_samples": sum(r["resumed_samples"] for r in steps),
        "multi_version_samples": sum(r["multi_version_samples"] for r in steps),
        "max_versions_in_a_trained_sample": max((r["max_versions_in_a_sample"] for r in steps), default=1),
        "failed_samples": sum(r["failed_samples"] for r in steps),
    }
