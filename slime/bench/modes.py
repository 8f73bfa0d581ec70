"""One mode of ``slime bench rollout``: an engine, the real scheduler and ``run_step``, x steps.

::

    engine (fresh sim process,  ──► CountingPool ──► Scheduler(mode) ──► run_step x steps ──► metrics
    or --engine-urls)               (in flight,       generate = DrawnLengths.generate: max_new_tokens =
                                     occupancy)        rest of the sample's draw, ignore_eos
                                    train_step = sleep(train_s / time_scale) in a worker thread
                                    load = pool.update_weights_from_disk(path, str(version), flush_cache=...)

Every engine generates exactly each sample's drawn length (``lengths.py``); each batch is checked
(``length_mismatch_samples``, 0 when enforced). An engine given by URL first loads ``weights_path``
as version "0" (aborting anything left), so every mode starts on the same weights. The weight
update after each step reads ``weights_path`` (a real load; the sim engine reads nothing and charges
``--weight-sync-ms``); ``flush_cache`` is true only after an abort pause (nothing in flight): SGLang
0.5.17 dies on a cache flush while requests are paused in place (async mode).

Metrics: see ``rollout.py``. ``engine_occupancy`` is measured from the client side for every engine
(``occupancy.py``). A simulated engine's ``/sim_stats`` (reset after it is ready, read when the
last step ends) adds ``slot_utilization`` over the whole loop, idle time included, and
``slot_utilization_busy`` over the decode steps only (time with >= 1 request running).
Rates per second of engine time (``*_per_engine_s``) are wall rates / ``time_scale`` (1 for a real
engine), so a simulated engine run faster than real time compares with a real one.

Token accounting at the end (``wasted_tokens``, simulated engine): every token the engine generated
is trained, masked as too stale, or still waiting (partial queue, or ready for the next step)::

    generated = trained + masked_stale + dropped_or_filtered + leftover_partial + leftover_ready
    wasted    = generated - trained - leftover_partial - leftover_ready

Example (async, eta 4, 10 steps at time scale 10): generated 4.93M = trained 3.98M + masked 0.12M
+ leftover partial 0.52M + leftover ready 0.32M, so wasted = 0.12M (all of it masked, lag 5).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from slime.bench.engine_proc import process_cpu_s, read_sim_stats, reset_sim_stats, sim_engine_process
from slime.bench.lengths import DrawnLengths
from slime.bench.occupancy import OccupancyMeter
from slime.bench.workload import Mode, Workload
from slime.config import RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.engines.pool import HttpEnginePool
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.train_metrics import TrainMetrics
from slime.types import Group, JsonObject, Sample

__all__ = ["run_mode", "CountingPool", "BenchWeightSync"]

READY_TIMEOUT_S = 60.0


class CountingPool(HttpEnginePool):
    """``HttpEnginePool`` that counts the ``/generate`` calls it is asked for (the requests issued) and
    feeds ``meter`` (requests in flight; paused in place) when one is attached."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.num_generate = 0
        self.meter: OccupancyMeter | None = None

    async def generate(self, *args: Any, **kwargs: Any):
        self.num_generate += 1
        meter = self.meter
        if meter is not None:
            meter.add(1)
        try:
            return await super().generate(*args, **kwargs)
        finally:
            if meter is not None:
                meter.add(-1)

    async def pause_generation(self, mode: str = "abort") -> dict[str, None]:
        out = await super().pause_generation(mode)  # type: ignore[arg-type]
        if self.meter is not None and mode == "in_place":
            self.meter.set_paused(True)
        return out

    async def continue_generation(self) -> dict[str, None]:
        if self.meter is not None:
            self.meter.set_paused(False)
        return await super().continue_generation()


class BenchWeightSync:
    """Weight sync of the benchmark: ``/update_weights_from_disk`` of ``weights_path`` (a checkpoint
    a real engine can load; the sim engine reads nothing and charges ``--weight-sync-ms``).

    The cache is flushed only when the load follows an abort pause (``abort_all_requests``: nothing
    is in flight); after an in-place pause it is not (SGLang 0.5.17 dies flushing with requests
    paused in place). ``load_s`` records the wall seconds of each load.
    """

    def __init__(self, pool: HttpEnginePool, weights_path: str | None = None):
        self.pool = pool
        self.weights_path = weights_path
        self.load_s: list[float] = []

    async def save(self, version: int) -> str:
        return self.weights_path or f"/nonexistent/slime-bench/v{version}"

    async def load(self, path: str, version: int, *, abort_all_requests: bool = True) -> None:
        t0 = time.monotonic()
        await self.pool.update_weights_from_disk(
            path, weight_version=str(version), abort_all_requests=abort_all_requests, flush_cache=abort_all_requests
        )
        self.load_s.append(time.monotonic() - t0)

    async def close(self) -> None:
        """Nothing to release."""


async def _reward_one(sample: Sample) -> float:
    return 1.0


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _tokens(groups: Sequence[Group]) -> int:
    return sum(g.num_response_tokens for g in groups)


async def run_mode(
    mode: Mode,
    wl: Workload,
    *,
    engine_urls: Sequence[str] | None = None,
    weights_path: str | None = None,
    log: Callable[[str], None] = print,
) -> JsonObject:
    """Run ``wl.steps`` steps of ``mode`` and return its metrics (see ``rollout.py`` for the keys).

    Without ``engine_urls`` a fresh simulated engine process is started and stopped for this mode.
    With them, ``wl.time_scale`` should be 1 (a real engine keeps real time) and ``wl.max_running_requests``
    the engines' total running cap (the occupancy's denominator).
    """
    async with contextlib.AsyncExitStack() as stack:
        pid = None
        if engine_urls is None:
            proc = await stack.enter_async_context(sim_engine_process(wl.sim_flags()))
            urls, pid = [proc.url], proc.pid
        else:
            urls = list(engine_urls)
        return await _run(mode, wl, urls, engine_pid=pid, weights_path=weights_path, log=log)


async def _run(
    mode: Mode,
    wl: Workload,
    urls: list[str],
    *,
    engine_pid: int | None,
    weights_path: str | None,
    log: Callable[[str], None],
) -> JsonObject:
    """``wl.steps`` steps of ``mode`` on the engines at ``urls``, measured: ``_metrics``, occupancy and weight loads."""
    rollout = wl.rollout_config()
    prompts = wl.prompts()
    lengths = DrawnLengths(median=wl.median, p99=wl.p99, max_len=wl.max_len, seed=wl.seed)
    async with aiohttp.ClientSession() as stats_session, CountingPool(urls, config=rollout) as pool:
        await pool.wait_ready(READY_TIMEOUT_S)
        await _load_version_zero(pool, weights_path)
        has_stats = await reset_sim_stats(stats_session, urls)
        engine_cpu0 = process_cpu_s(engine_pid) if engine_pid else None
        sync = BenchWeightSync(pool, weights_path)
        buffer = DataBuffer()
        pool.meter = meter = OccupancyMeter(wl.max_running_requests)
        cpu0, t0 = time.process_time(), time.monotonic()
        async with asyncio.TaskGroup() as tg:
            sched = _scheduler(mode, wl, rollout, prompts, pool, buffer, lengths, tg)
            records, mismatches = await _steps(mode, wl, sched, sync, lengths, log=log)
            wall_s = time.monotonic() - t0
            cpu_s = time.process_time() - cpu0
            occupancy = {"engine_occupancy": meter.occupancy(), "engine_busy_fraction_client": meter.busy_fraction()}
            pool.meter = None
            num_requests = pool.num_generate
            window = await read_sim_stats(stats_session, urls) if has_stats else None
            engine_cpu = process_cpu_s(engine_pid) if engine_pid else None
            await sched.shutdown()
        final = await read_sim_stats(stats_session, urls) if has_stats else None
    out = _metrics(
        records,
        buffer,
        wl,
        wall_s=wall_s,
        cpu_s=cpu_s,
        num_requests=num_requests,
        window=window,
        final=final,
        engine_cpu_s=None if engine_cpu is None or engine_cpu0 is None else engine_cpu - engine_cpu0,
    )
    out.update(
        occupancy,
        length_mismatch_samples=sum(mismatches),
        weight_load_s=sync.load_s,
        weight_load_median_s=statistics.median(sync.load_s) if sync.load_s else None,
    )
    return out


def _scheduler(
    mode: Mode,
    wl: Workload,
    rollout: RolloutConfig,
    prompts: tuple[list[PromptRow], dict[str, list[int]]],
    pool: CountingPool,
    buffer: DataBuffer,
    lengths: DrawnLengths,
    tg: asyncio.TaskGroup,
) -> Scheduler:
    """The real ``Scheduler`` of ``mode`` over ``prompts`` (``Workload.prompts``): constant reward 1, each
    response as long as ``lengths`` drew it, no detokenization."""
    rows, prompt_ids = prompts
    return Scheduler(
        wl.loop_config(mode),
        rollout,
        source=PromptSource(rows, shuffle=False),
        tokenize=prompt_ids.__getitem__,
        decode=lambda ids: "",
        pool=pool,
        buffer=buffer,
        reward_fn=_reward_one,
        task_group=tg,
        generate_fn=lengths.generate,
    )


async def _load_version_zero(pool: HttpEnginePool, weights_path: str | None) -> None:
    """Engines given by URL may hold another version (an earlier mode) or other weights: load ours as "0"."""
    if weights_path is not None:
        await pool.update_weights_from_disk(weights_path, weight_version="0", abort_all_requests=True, flush_cache=True)
    else:
        for client in pool.clients:
            await client.update_weight_version("0", abort_all_requests=True)


async def _steps(
    mode: Mode,
    wl: Workload,
    sched: Scheduler,
    sync: BenchWeightSync,
    lengths: DrawnLengths,
    *,
    log: Callable[[str], None],
) -> tuple[list[JsonObject], list[int]]:
    """``run_step`` x ``wl.steps`` with a train step that sleeps ``wl.train_s`` engine seconds; each step's
    record (plus load average and length mismatches) and the mismatches per step."""
    train_wall_s = wl.train_s / wl.time_scale
    mismatches: list[int] = []

    def train_step(groups: list[Group]) -> TrainMetrics:
        time.sleep(train_wall_s)  # runs in a worker thread (run_step uses asyncio.to_thread)
        return TrainMetrics()

    async def on_batch(groups: list[Group]) -> None:
        mismatches.append(lengths.mismatches(groups))

    records: list[JsonObject] = []
    for step in range(1, wl.steps + 1):
        _, step_record = await run_step(sched, train_step=train_step, sync=sync, on_batch=on_batch)
        record = step_record.to_dict()
        record["loadavg_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        record["length_mismatch_samples"] = mismatches[-1]
        records.append(record)
        log(_step_line(mode, step, wl.steps, record))
    return records, mismatches


def _step_line(mode: str, step: int, steps: int, r: JsonObject) -> str:
    return (
        f"[{mode:>5}] step {step:>2}/{steps} {r['step_time_s']:6.1f}s (rollout wait {r['rollout_wait_s']:5.1f}s) "
        f"tokens {r['response_tokens']:>7} aborted {r['aborted_samples']:>3} resumed {r['resumed_samples']:>3} "
        f"lag max {r['max_version_lag']} partial {r['partial_groups_queued']:>2} ready {r['ready_groups_left']:>2}"
    )


def _metrics(
    records: list[JsonObject],
    buffer: DataBuffer,
    wl: Workload,
    *,
    wall_s: float,
    cpu_s: float,
    num_requests: int,
    window: list[JsonObject] | None,
    final: list[JsonObject] | None,
    engine_cpu_s: float | None,
) -> JsonObject:
    """One mode's metrics from its step records and the buffer left over (``rollout.py`` names the keys); with
    the sim engines' stats of the measured window (``window``) and at the end (``final``), the engine's side too."""
    delivered = sum(r["response_tokens"] for r in records)
    trained = sum(r["trained_tokens"] for r in records)
    samples = sum(r["num_samples"] for r in records)
    step_times = [r["step_time_s"] for r in records]
    lag_histogram, off_policy_fraction, max_lag = _lag_stats(records)
    leftover_partial, leftover_ready = _tokens(buffer.partial_groups()), _tokens(buffer.ready)
    engine_s = wall_s * wl.time_scale  # engine (simulated) seconds; = wall for a real engine
    out: JsonObject = {
        "delivered_tokens_per_s": delivered / wall_s,
        "delivered_tokens_per_engine_s": delivered / engine_s,
        "trained_tokens_per_engine_s": trained / engine_s,
        "time_scale": wl.time_scale,
        "samples_per_s": samples / wall_s,
        "trained_tokens_per_s": trained / wall_s,
        "slot_utilization": None,
        "step_time_p50_s": _percentile(step_times, 0.5),
        "step_time_p99_s": _percentile(step_times, 0.99),
        "step_time_p50_engine_s": _percentile(step_times, 0.5) * wl.time_scale,
        "wasted_tokens": None,
        "client_cpu_ms_per_request": 1000.0 * cpu_s / max(1, num_requests),
        "wall_s": wall_s,
        "client_cpu_s": cpu_s,
        "steps": len(records),
        "delivered_tokens": delivered,
        "trained_tokens": trained,
        "delivered_samples": samples,
        "requests_issued": num_requests,
        "aborted_samples": sum(r["aborted_samples"] for r in records),
        "resumed_samples": sum(r["resumed_samples"] for r in records),
        "masked_stale_tokens": sum(r["masked_stale_tokens"] for r in records),
        "lag_histogram": lag_histogram,
        "off_policy_token_fraction": off_policy_fraction,
        "max_version_lag": max_lag,
        "multi_version_samples": sum(r["multi_version_samples"] for r in records),
        "leftover_partial_tokens": leftover_partial,
        "leftover_ready_tokens": leftover_ready,
        "step_times_s": step_times,
        "rollout_wait_s": [r["rollout_wait_s"] for r in records],
        "mean_response_len": delivered / max(1, samples),
        "engine_cpu_s": engine_cpu_s,
        "loadavg_1m_per_step": [r["loadavg_1m"] for r in records],
    }
    if window is not None and final is not None:
        out.update(_engine_metrics(window, final, accounted=trained + leftover_partial + leftover_ready))
    return out


def _lag_stats(records: list[JsonObject]) -> tuple[dict[str, int], float, int]:
    """Over all steps: trained tokens per version lag (``{"0": n, ...}``), the fraction with lag > 0, the largest lag."""
    lag: Counter[int] = Counter()
    for r in records:
        lag.update(r["lag_histogram"])
    lag_total = sum(lag.values())
    off_policy = sum(n for k, n in lag.items() if k > 0) / lag_total if lag_total else 0.0
    return {str(k): v for k, v in sorted(lag.items())}, off_policy, max(lag) if lag else 0


def _engine_metrics(window: list[JsonObject], final: list[JsonObject], *, accounted: int) -> JsonObject:
    """Slot utilisation, generated and wasted tokens (generated, less ``accounted``: trained or left in the buffer),
    and the engine's own counters, from the sim engines' stats."""
    cap = sum(s["max_running_requests"] for s in window)
    generated = sum(s["tokens_generated"] for s in final)
    return dict(
        slot_utilization=sum(s["mean_running"] for s in window) / cap,
        slot_utilization_busy=sum(s["running_integral_s"] for s in window)
        / max(1e-9, sum(s["busy_sim_s"] * s["max_running_requests"] for s in window)),
        generated_tokens=generated,
        wasted_tokens=generated - accounted,
        engine_requests=sum(s["requests_finished"] + s["requests_aborted"] for s in final),
        engine_prefill_tokens=sum(s["prefill_tokens"] for s in window),
        engine_max_step_lag_ms=max(s["max_step_lag_ms"] for s in window),
        engine_time_dilation=sum(s["busy_wall_s"] * s["time_scale"] for s in window)
        / max(1e-9, sum(s["busy_sim_s"] for s in window)),
        engine_busy_fraction=sum(s["busy_sim_s"] for s in window) / max(1e-9, sum(s["elapsed_sim_s"] for s in window)),
    )
