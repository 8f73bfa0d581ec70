"""The run driver: wires data, engines, scheduler, trainer and weight sync into one RL run.

One rollout step is ``slime.loop.step.run_step`` (``--num-rollout`` of them); evaluation runs
before the first and after the last, with generation paused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import msgspec

from slime.config import Config
from slime.data.dataset import PromptRow, PromptSource, load_jsonl_prompts
from slime.loop.buffer import DataBuffer
from slime.loop.evaluate import evaluate
from slime.loop.report import MetricsWriter, format_step_line, write_json_atomic
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.obs.observers import Observers
from slime.obs.plots import write_plots
from slime.rollout.launch import launch_embedded_engines
from slime.rollout.pool import EnginePool
from slime.rollout.rewards import load_function
from slime.sync.disk import DiskWeightSync

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

        evals = [PromptRow(index=i, prompt=r["prompt"], label=r["label"]) for i, r in enumerate(arith.generate_dataset(d.num_eval_prompts, seed=d.seed, split="eval"))]
    else:
        evals = []
    return train, evals[: d.num_eval_prompts]


async def run_training(config: Config, *, reward_fn: Any = None, progress: bool = True) -> dict[str, Any]:
    """Run a whole RL job; returns the summary also written to ``RUN_DIR/summary.json``."""
    from transformers import AutoTokenizer

    from slime.train.torch_backend import TorchTrainer

    config.validate()
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "config.json", msgspec.to_builtins(config))
    model_dir = config.engine.hf_checkpoint
    tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, model_dir)
    tokenize = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    if reward_fn is None:
        if config.rollout.custom_rm_path:
            reward_fn = load_function(config.rollout.custom_rm_path)
        else:
            from slime.data.arith import reward as reward_fn
    train_rows, eval_rows = await asyncio.to_thread(load_prompts, config)
    source = PromptSource(train_rows, shuffle=config.data.rollout_shuffle, seed=config.data.seed)
    trainer = await asyncio.to_thread(TorchTrainer, config.train, model_dir=model_dir)
    weights_dir = config.sync.weights_dir or str(run_dir / "weights")
    metrics = MetricsWriter(run_dir)
    t_start = time.monotonic()

    async with Observers(config, run_dir, progress=progress) as obs, _engines(config) as urls, EnginePool(urls, config=config.rollout) as pool:
        await pool.wait_ready(config.engine.startup_timeout_s)
        tracer = obs.tracer
        sync = DiskWeightSync(msgspec.structs.replace(config.sync, weights_dir=weights_dir), pool=pool, save_fn=trainer.save_hf)
        version = 0
        eval_kw = dict(
            pool=pool, tokenize=tokenize, decode=decode, reward_fn=reward_fn,
            max_response_len=config.rollout.rollout_max_response_len, reward_timeout_s=config.rollout.reward_timeout_s,
        )
        with tracer.span("eval", "eval", step=0, num_prompts=len(eval_rows)):
            before = await evaluate(eval_rows, engine_version=version, **eval_kw) if eval_rows else {"accuracy": float("nan")}
        metrics.write(rec := {"kind": "eval", "step": 0, "policy_version": 0, **before})
        obs.record(rec)
        log.info("eval before RL: accuracy %.3f", before["accuracy"])
        totals = {"aborted_samples": 0, "resumed_samples": 0, "max_versions_in_a_trained_sample": 1, "multi_version_samples": 0}
        lp = config.loop
        buffer = DataBuffer(buffer_filter=load_function(lp.buffer_filter_path, flag="--buffer-filter-path") if lp.buffer_filter_path else None)
        group_filter = load_function(lp.dynamic_sampling_filter_path, flag="--dynamic-sampling-filter-path") if lp.dynamic_sampling_filter_path else None
        async with asyncio.TaskGroup() as tg:
            sched = Scheduler(
                config.loop, config.rollout, source=source, tokenize=tokenize, decode=decode, pool=pool,
                buffer=buffer, reward_fn=reward_fn, task_group=tg, engine_version=version, group_filter=group_filter,
                tracer=tracer,
            )
            obs.watch(pool=pool, buffer=buffer)
            for step in range(1, config.loop.num_rollout + 1):
                version, groups, record = await run_step(sched, train_step=trainer.train_step, sync=sync, version=version, tracer=tracer)
                record["step"] = step
                metrics.write(record)
                totals["aborted_samples"] += record["aborted_samples"]
                totals["resumed_samples"] += record["resumed_samples"]
                totals["multi_version_samples"] += record["multi_version_samples"]
                totals["max_versions_in_a_trained_sample"] = max(totals["max_versions_in_a_trained_sample"], record["max_versions_in_a_sample"])
                obs.record(record, format_step_line(record))
                if config.loop.eval_interval and step % config.loop.eval_interval == 0 and step < config.loop.num_rollout:
                    async with sched.paused():
                        with tracer.span("eval", "eval", step=step, num_prompts=len(eval_rows)):
                            mid = await evaluate(eval_rows, engine_version=version, **eval_kw)
                    metrics.write(rec := {"kind": "eval", "step": step, "policy_version": version, **mid})
                    obs.record(rec, f"eval @ step {step}: accuracy {mid['accuracy']:.3f}")
            await sched.shutdown()
        obs.progress.close()
        with tracer.span("eval", "eval", step=config.loop.num_rollout, num_prompts=len(eval_rows)):
            after = await evaluate(eval_rows, engine_version=version, **eval_kw) if eval_rows else {"accuracy": float("nan")}
        metrics.write(rec := {"kind": "eval", "step": config.loop.num_rollout, "policy_version": version, **after})
        obs.record(rec)
    metrics.close()
    summary = {
        "eval_accuracy_before": before["accuracy"],
        "eval_accuracy_after": after["accuracy"],
        "num_eval_prompts": len(eval_rows),
        "num_rollout": config.loop.num_rollout,
        "final_policy_version": version,
        "wall_time_s": round(time.monotonic() - t_start, 1),
        "mode": config.loop.mode,
        "partial_groups_left": buffer.num_partial,
        "groups_trained": len(buffer.taken),
        **totals,
    }
    write_json_atomic(run_dir / "summary.json", summary)
    await asyncio.to_thread(write_plots, metrics.records, run_dir)
    return summary


def _engines(config: Config):
    e = config.engine
    if e.rollout_external_engine_addrs:
        return _external(list(e.rollout_external_engine_addrs))
    return launch_embedded_engines(
        e.hf_checkpoint, num_engines=e.num_engines, threads=e.engine_threads,
        max_running_requests=e.max_running_requests, startup_timeout_s=e.startup_timeout_s, seed=config.seed,
    )


class _external:
    def __init__(self, urls: list[str]):
        self.urls = [u if u.startswith("http") else f"http://{u}" for u in urls]

    async def __aenter__(self) -> list[str]:
        return self.urls

    async def __aexit__(self, *exc: object) -> None:
        return None
