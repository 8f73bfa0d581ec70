"""One RL step, shared by the main job and the rollout benchmark.

::

    groups  = await scheduler.next_batch(rollout_batch_size)       # sync / APRIL / async
    stats   = apply_staleness(groups, trainer_version, max_staleness)
    metrics = await asyncio.to_thread(train_step, groups)          # the loop keeps generating
    path    = await sync.save(version + 1)                          # still generating
    async with scheduler.paused(mode):                              # abort+drain, or pause in place
        await sync.load(path, version + 1); version += 1            # engines at the new version

With ``colocate`` (engines share the trainer's devices) generation is paused (abort + drain) from
the end of the rollout to the end of the sync, and engine memory is released around the train step
(docs/sglang.md#memory; released weights are lost, hence the sync right after)::

    async with scheduler.paused("abort"):
        release_memory_occupation -> train_step -> sync.save -> resume_memory_occupation -> sync.load

(THUDM/slime resumes the ``weights`` tag, syncs, then resumes ``kv_cache``; we resume every tag
before the sync because the tag set differs across SGLang versions.)

In ``async`` mode the update pauses in place (requests keep their KV and continue on the new
weights) and the prefix cache is not flushed (SGLang 0.5.17 dies on a flush with requests paused in
place). Cached KV of older weights then survives, and tokens of requests that reuse it are tagged no
newer than the pool's ``kv_cache_version`` (``slime.rollout.generate.token_versions``). Once any
request has reused cached KV since the last flush, an in-place update would leave every later
cache-hitting token tagged with the last flush's version, a lag that grows with every update (seen
on the H200: 8 of 15 async steps had all their tokens masked as over-stale), so from then on each
update pauses with ``abort`` and flushes instead (aborted requests resume token-exactly, as APRIL
partials). Launched SGLang servers avoid this in async mode with ``--disable-radix-cache``
(``slime.engines.fleet.plan``); the embedded engine has no prefix cache.

The trainer's version equals the engines' version at each train step (weights are synced right
after every step), so a token's lag at training is how many updates happened since it was sampled.
Both are one object, the run's ``PolicyVersion`` (``sched.version``, ``slime.loop.version``): the
train step bumps it, the weight sync publishes it, nothing else writes it.

``on_batch(groups)`` (recording, ``--save-debug-rollout-data``) is awaited right after the groups
are taken, before staleness masking. ``train_step=None`` (rollout-only, ``--debug-rollout-only``)
skips the train step and the weight sync: the version never moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from slime.config import LoopConfig
from slime.engines.interface import EnginePool
from slime.loop.counters import StepStats
from slime.loop.interface import RolloutScheduler
from slime.loop.offpolicy import apply_staleness, length_bias
from slime.obs.trace import NULL_TRACER, RunTracer
from slime.step_record import StepRecord
from slime.sync.base import WeightSync
from slime.train_metrics import TrainMetrics
from slime.types import Group, Sample, Status, valid_samples

__all__ = ["run_step", "batch_stats", "pause_mode"]

log = logging.getLogger(__name__)
_WARNED_CACHE_REFRESH: set[int] = set()  # ids of the pools ``pause_mode`` warned about reused cached KV


def batch_stats(groups: list[Group]) -> dict[str, float]:
    """The step record's batch numbers. Every mean and total is over the samples that count
    (``slime.types.valid_samples``: FAILED samples are left out, as GRPO leaves them out);
    ``num_samples`` counts every sample taken and ``failed_samples_in_batch`` the FAILED ones.
    Example: rewards [1, 0, FAILED], 3 tokens each -> reward_mean 0.5, trained_tokens 6, num_samples 3.

    With teacher-scored samples (``--use-opd``) also ``opd/reverse_kl``: mean over the trainable
    tokens of counted samples of ``rollout_logprob - teacher_logprob`` (nats; the sampled estimate of
    KL(student || teacher) per token, from the engine's logprobs; the trainer's
    ``train/opd_reverse_kl`` uses its own), and ``opd/teacher_logprob_mean`` over the same tokens."""
    num_samples = sum(len(g.samples) for g in groups)
    samples = valid_samples(groups)
    n = max(1, len(samples))
    return {
        **_opd_stats(samples),
        "reward_mean": sum(s.reward or 0.0 for s in samples) / n,
        "accuracy": sum((s.reward or 0.0) >= 1.0 for s in samples) / n,
        "response_len_mean": sum(len(s.response_ids) for s in samples) / n,
        "response_tokens": sum(len(s.response_ids) for s in samples),
        "num_samples": num_samples,
        "truncated_samples": sum(s.status is Status.TRUNCATED for s in samples),
        "failed_samples_in_batch": num_samples - len(samples),
        "trained_tokens": sum(sum(s.loss_mask) for s in samples),
    }


def _opd_stats(samples: list[Sample]) -> dict[str, float]:
    scored = [(s, t) for s in samples if (t := s.teacher_logprobs) is not None]
    if not scored:
        return {}
    kl = teacher = 0.0
    num_tokens = 0
    for s, teacher_lps in scored:
        for student_lp, teacher_lp, m in zip(s.rollout_logprobs, teacher_lps, s.loss_mask):
            if m:
                kl += student_lp - teacher_lp
                teacher += teacher_lp
                num_tokens += 1
    denom = max(num_tokens, 1)
    return {"opd/reverse_kl": kl / denom, "opd/teacher_logprob_mean": teacher / denom}


async def run_step(
    sched: RolloutScheduler,
    *,
    train_step: Callable[[list[Group]], TrainMetrics] | None,
    sync: WeightSync | None,
    tracer: RunTracer | None = None,
    colocate: bool = False,
    newest_only: bool = False,
    on_batch: Callable[[list[Group]], Awaitable[object]] | None = None,
) -> tuple[list[Group], StepRecord]:
    """Run one rollout + train + weight-sync step. Returns (groups, step record).

    The run's ``PolicyVersion`` is ``sched.version``: the train step bumps it (checked against the
    trainer's own ``policy_version`` metric) and the weight sync publishes it to the engines.

    ``tracer`` (``slime.obs.trace.Tracer``) gets the phases on its ``driver`` track: ``step`` >
    ``rollout_wait``, ``train_step``, ``weight_sync`` > ``save``, ``pause``, ``load``, ``resume``
    (+ ``release_memory``, ``resume_memory`` with ``colocate``). ``colocate``: see the module doc;
    ``sched.pool`` must then have ``release_memory_occupation`` / ``resume_memory_occupation``.
    The record carries the strategy's ``stats`` (bytes, seconds, ...) as ``weight_sync/*``.

    Raises:
        RuntimeError: the trainer reports another policy version than the loop counts.
        ValueError: ``train_step`` without ``sync`` (pass ``NoWeightSync`` for none); ``colocate``
            with a scheduler that has no engine pool.
    """
    _check_step(sched, train_step, sync, colocate=colocate)
    config, version, tr = sched.config, sched.version, tracer or NULL_TRACER
    step_start, t0 = tr.now(), time.monotonic()
    with tr.span("rollout_wait", "rollout", num_groups=config.rollout_batch_size):
        groups = await sched.next_batch(config.rollout_batch_size)
    times: dict[str, object] = {"rollout_wait_s": time.monotonic() - t0}
    if on_batch is not None:
        await on_batch(groups)  # recorded as generated: before apply_staleness edits the loss masks in place
    # lag against the trainer's version: the weights this batch trains (== the engines' between steps)
    stale = apply_staleness(
        groups, trainer_version=version.trainer, max_staleness=config.max_staleness, newest_only=newest_only
    )
    # after the mask: what trains, against the draws completed since the last batch was taken
    bias = length_bias(groups, sched.buffer.pop_completed(), trainer_version=version.trainer)
    batch = batch_stats(groups)
    mode = pause_mode(config, sched.pool, version.trainer, colocate=colocate)
    if train_step is not None and sync is not None:  # both or neither (_check_step); None: rollout-only
        times |= await _train_and_sync(
            sched, train_step, sync, groups, tr, mode=mode, colocate=colocate, num_samples=batch["num_samples"]
        )
    # taken after the sync: the counters also cover the generation that overlapped the train step
    record = _record(sched, batch, stale, sched.pop_stats(), time.monotonic() - t0, bias=bias, **times)
    tr.complete("step", "step", step_start, rollout_id=sched.rollout_id, version=version.engines)
    return groups, record


def _check_step(
    sched: RolloutScheduler,
    train_step: Callable[[list[Group]], TrainMetrics] | None,
    sync: WeightSync | None,
    *,
    colocate: bool,
) -> None:
    """``run_step``'s ValueErrors (its docstring)."""
    if train_step is not None and sync is None:
        raise ValueError("run_step: a train step needs a weight sync (slime.loop.record.NoWeightSync for none)")
    if colocate and sched.pool is None:
        raise ValueError("run_step(colocate=True): the scheduler has no engine pool to release memory from")


async def _train_and_sync(
    sched: RolloutScheduler,
    train_step: Callable[[list[Group]], TrainMetrics],
    sync: WeightSync,
    groups: list[Group],
    tr: RunTracer,
    *,
    mode: Literal["abort", "in_place"],
    colocate: bool,
    num_samples: float,
) -> dict[str, object]:
    """Train on ``groups`` (in a thread: the engines keep generating), then save the new weights and load
    them into the engines; returns the record's train and weight-sync fields. With ``colocate``
    generation stays paused throughout and the engines release their memory around the train step."""
    memory_pool = sched.pool if colocate else None  # the engines that give their memory to the trainer
    released: dict[str, float] = {}
    # colocate: the engines share the trainer's devices, so abort and drain before their memory goes
    async with sched.paused("abort") if memory_pool is not None else contextlib.nullcontext():
        if memory_pool is not None:  # colocate: nothing generates until the sync is done
            released = await _release_memory(memory_pool, tr)
        t1 = time.monotonic()
        with tr.span("train_step", "train", version=sched.version.trainer, num_samples=num_samples):
            # a thread, not the loop: rollouts keep running (and the scheduler admitting) during the step
            metrics = await asyncio.to_thread(train_step, groups)
        # bumped before the save, so the staged weights carry the new version; raises if the trainer's count drifted
        new = sched.version.bump(metrics.policy_version)
        t_train = time.monotonic() - t1
        sync_start = tr.now()
        with tr.span("save", "weight_sync", version=new):
            staged = await sync.save(new)
        t2 = time.monotonic()  # the save overlaps generation: weight_sync_s counts from here
        if memory_pool is not None:
            with tr.span("resume_memory", "weight_sync"):
                # before the load: released weights are lost; all tags resumed (the set differs across SGLang versions)
                await memory_pool.resume_memory_occupation()
        # colocate: the outer context already holds generation paused
        resume_start = await _load(sched, sync, staged, new, tr, mode=mode, paused=colocate)
    tr.complete("resume", "weight_sync", resume_start, mode=mode)
    tr.complete("weight_sync", "weight_sync", sync_start, version=new, mode=mode)
    tr.instant("policy_version", "weight_sync", version=new)
    return dict(
        train_time_s=t_train,
        weight_sync_s=time.monotonic() - t2,
        weight_sync_in_place=int(mode == "in_place"),
        train=metrics.to_dict(),
        weight_sync=dict(getattr(sync, "stats", {})) | released,
    )


async def _release_memory(pool: EnginePool, tr: RunTracer) -> dict[str, float]:
    """``--colocate``: the engines release their device memory for the train step; returns ``_released_gib``."""
    free_before = device_free_bytes()
    with tr.span("release_memory", "weight_sync"):
        await pool.release_memory_occupation()
    return _released_gib(free_before, device_free_bytes())


async def _load(
    sched: RolloutScheduler,
    sync: WeightSync,
    staged: object,
    new: int,
    tr: RunTracer,
    *,
    mode: Literal["abort", "in_place"],
    paused: bool,
) -> int:
    """Pause generation by ``mode`` (unless already ``paused``: colocate), load the ``staged`` weights of
    version ``new`` into the engines and publish it; returns the trace time the resume starts at."""
    pause_start = tr.now()
    async with contextlib.nullcontext() if paused else sched.paused(mode):
        tr.complete("pause", "weight_sync", pause_start, mode=mode)
        with tr.span("load", "weight_sync", version=new):
            await sync.load(staged, new, abort_all_requests=mode == "abort")
        sched.version.publish()  # inside the pause: every request sent after the resume is stamped with the new version
        return tr.now()


def device_free_bytes() -> int | None:
    """Free memory of this process's current CUDA device in bytes (``torch.cuda.mem_get_info``: the whole
    device, other processes' memory included); None without CUDA. Read around ``--colocate``'s release."""
    import torch

    return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else None


def _released_gib(before: int | None, after: int | None) -> dict[str, float]:
    """``engine_memory_released_gib``: device memory freed by the engines' release (GiB; the trainer is idle
    then), or {} without CUDA. On the trainer's current device only: a colocated engine spanning several
    GPUs frees memory on the others too."""
    return {} if before is None or after is None else {"engine_memory_released_gib": (after - before) / 2**30}


def pause_mode(
    config: LoopConfig, pool: EnginePool | None, version: int, *, colocate: bool = False
) -> Literal["abort", "in_place"]:
    """How the update to ``version + 1`` pauses generation: ``"in_place"`` in async mode unless a
    request has reused cached KV since the engines' caches were last emptied (see the module doc),
    else ``"abort"`` (then the update also flushes the caches).

    ``pool`` None (no engines, train-only): no cache hits. Example: async,
    ``pool.num_prefix_cache_hits == 0`` -> "in_place"; 3 hits -> "abort".
    """
    # only async updates in place; colocate's engines were drained and freed for the train step
    if config.mode != "async" or colocate:
        return "abort"
    if pool is None:  # train-only: no engines, hence no cached KV that could go stale
        return "in_place"
    hits = pool.num_prefix_cache_hits
    if hits and pool.kv_cache_version is not None:
        if id(pool) not in _WARNED_CACHE_REFRESH:
            log.warning(
                "the engines reuse cached KV (cached_tokens > 0 in %d replies): async updates abort and flush the "
                "prefix cache instead of pausing in place; start SGLang with --disable-radix-cache to keep "
                "in-place updates (slime does for the servers it launches)",
                hits,
            )
            _WARNED_CACHE_REFRESH.add(id(pool))  # once per pool (a run has one)
        return "abort"
    return "in_place"


def _record(
    sched: RolloutScheduler, batch: dict[str, Any], stale: dict[str, Any], st: StepStats, dt: float, **step: Any
) -> StepRecord:
    """The step record: the batch, the scheduler and buffer counters (``StepStats`` since the last step),
    the off-policy statistics and the step's own times and metrics. ``batch``, ``stale`` and ``step`` are
    spread into the struct's keyword fields (``Any``: the struct types each one)."""
    return StepRecord(
        policy_version=sched.version.engines,
        opd_reverse_kl=batch.get("opd/reverse_kl"),
        opd_teacher_logprob_mean=batch.get("opd/teacher_logprob_mean"),
        **{k: v for k, v in batch.items() if not k.startswith("opd/")},
        aborted_samples=st.aborted_samples,
        resumed_samples=st.resumed_samples,
        started_groups=st.started_groups,
        generated_tokens=st.generated_tokens,
        failed_samples=st.failed_samples,
        filtered_groups=st.filtered_groups,
        dropped_stale_groups=st.dropped_stale_groups,
        offline_groups=st.offline_groups,
        buffer_evicted_groups=st.evicted_groups,
        buffer_expired_groups=st.expired_groups,
        tokens_per_s=st.generated_tokens / dt,
        step_time_s=dt,
        partial_groups_queued=sched.buffer.num_partial,
        ready_groups_left=sched.buffer.num_ready,
        **stale,
        **step,
    )
