"""``slime bench rollout``: sync vs APRIL vs fully async on the long-tail workload, side by side.

One invocation runs every mode in ``--modes`` on the same simulated engine config (a fresh engine
process per mode, or the engines of ``--engine-urls``), the same prompts and the same seed, with
the real ``Scheduler`` and ``slime.loop.step.run_step``; then measures our own overhead (scheduler
completions/s on an instant in-process engine; ``EnginePool`` vs bare aiohttp on loopback).

Per mode (``modes.py``): ``delivered_tokens_per_s`` (response tokens handed to the trainer / wall
time of the whole loop: rollout, train steps and weight syncs), ``samples_per_s``,
``slot_utilization`` (engine ``/sim_stats``: time-average of running requests / cap over the loop),
``step_time_p50_s`` / ``step_time_p99_s``, ``lag_histogram`` and ``off_policy_token_fraction`` over
trained tokens, ``wasted_tokens``, ``client_cpu_ms_per_request`` (``time.process_time()`` of this
process over the loop / ``/generate`` requests issued; the engine is another process), requests
issued, aborted and resumed samples.

JSON (``--json``)::

    {"modes": {"sync": {...}, "april": {...}, "async": {...}}, "scheduler_completions_per_s": N,
     "http_requests_per_s": N, "bare_aiohttp_requests_per_s": N,
     "speedup_vs_sync": {...}, "http_ratio_vs_bare": x, "targets": {...}, "workload": {...}, ...}

Usage: ``slime bench rollout [--steps 10] [--modes sync,april,async] [--json PATH] [--png PATH]``
(``python -m slime.bench.rollout`` is the same). The standard run takes ~20 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from slime.bench.modes import run_mode
from slime.bench.overhead import http_overhead, scheduler_overhead
from slime.bench.report import check_targets, format_table, plot
from slime.bench.workload import MODES, Workload

__all__ = ["main", "build_parser", "run_bench"]


def build_parser() -> argparse.ArgumentParser:
    d = Workload()
    p = argparse.ArgumentParser(prog="slime bench rollout", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of sync,april,async")
    p.add_argument("--steps", type=int, default=d.steps, help="rollout steps per mode")
    p.add_argument("--time-scale", type=float, default=d.time_scale, help="simulated time / wall time")
    p.add_argument("--train-s", type=float, default=d.train_s, help="simulated seconds of one train step")
    p.add_argument("--median", type=float, default=d.median, help="median response length, tokens")
    p.add_argument("--p99", type=float, default=d.p99, help="99th percentile response length, tokens")
    p.add_argument("--max-len", type=int, default=d.max_len, help="response length cap (rollout_max_response_len)")
    p.add_argument("--seed", type=int, default=d.seed, help="engine and prompt seed")
    p.add_argument("--april-over-sampling", type=int, default=d.april_over_sampling, help="groups in flight in april")
    p.add_argument("--april-overlap-train", action=argparse.BooleanOptionalAction, default=d.april_overlap_train,
                   help="april keeps generating during the train step (--no-april-overlap-train: classic APRIL)")
    p.add_argument("--async-capacity", type=int, default=d.async_capacity, help="groups in flight in async")
    p.add_argument("--async-max-staleness", type=int, default=d.async_max_staleness, help="max_staleness of async")
    p.add_argument("--engine-urls", default=None, help="comma-separated running engines instead of a fresh sim engine per mode")
    p.add_argument("--weights-path", default=None,
                   help="path sent to /update_weights_from_disk; needed with real engines (the sim engine reads nothing)")
    p.add_argument("--overhead-samples", type=int, default=50_000, help="scheduler-overhead completions (0: skip)")
    p.add_argument("--http-requests", type=int, default=5_000, help="requests per HTTP-overhead round (0: skip)")
    p.add_argument("--http-concurrency", type=int, default=64)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--png", default=None, help="write the chart here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return p


def workload_from_args(ns: argparse.Namespace) -> Workload:
    return Workload(steps=ns.steps, time_scale=ns.time_scale, train_s=ns.train_s, median=ns.median, p99=ns.p99,
                    max_len=ns.max_len, seed=ns.seed, april_over_sampling=ns.april_over_sampling, april_overlap_train=ns.april_overlap_train,
                    async_capacity=ns.async_capacity, async_max_staleness=ns.async_max_staleness)


async def run_bench(wl: Workload, modes: list[str], *, engine_urls: list[str] | None = None, weights_path: str | None = None,
                    overhead_samples: int = 50_000,
                    http_requests: int = 5_000, http_concurrency: int = 64, log=print) -> dict[str, Any]:
    """Run the overhead measurements, then every mode; return the results dict (see module doc)."""
    results: dict[str, Any] = {"modes": {}, "scheduler_completions_per_s": None, "http_requests_per_s": None,
                               "bare_aiohttp_requests_per_s": None}
    meta = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "host": platform.node(),
            "platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "loadavg_start": _loadavg(), "argv": sys.argv, "git": _git_state()}
    if overhead_samples > 0:
        results["scheduler"] = await scheduler_overhead(overhead_samples, engine="fake")
        results["scheduler_sim_engine"] = await scheduler_overhead(overhead_samples, engine="sim")
        results["scheduler_completions_per_s"] = results["scheduler"]["completions_per_s"]
        log(f"scheduler: {results['scheduler_completions_per_s']:,.0f} completions/s on an instant in-process engine")
    if http_requests > 0:
        http = await http_overhead(http_requests, concurrency=http_concurrency, seed=wl.seed)
        results["http"] = http
        results["http_requests_per_s"] = http["http_requests_per_s"]
        results["bare_aiohttp_requests_per_s"] = http["bare_aiohttp_requests_per_s"]
        results["http_ratio_vs_bare"] = http["ratio_vs_bare"]
        log(f"http: EnginePool {http['http_requests_per_s']:,.0f} req/s vs bare aiohttp {http['bare_aiohttp_requests_per_s']:,.0f} req/s")
    for mode in modes:
        results["modes"][mode] = await run_mode(mode, wl, engine_urls=engine_urls, weights_path=weights_path, log=log)
    sync = results["modes"].get("sync")
    if sync:
        results["speedup_vs_sync"] = {}
        for mode, m in results["modes"].items():
            m["speedup_vs_sync"] = m["delivered_tokens_per_s"] / sync["delivered_tokens_per_s"]
            results["speedup_vs_sync"][mode] = m["speedup_vs_sync"]
    results["targets"] = check_targets(results)
    results["workload"] = msgspec.to_builtins(wl)
    meta["loadavg_end"] = _loadavg()
    results["meta"] = meta
    return results


def _git_state() -> str | None:
    """``<HEAD sha>`` plus ``+N files modified`` when the working tree differs (None outside a checkout)."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head} +{len(dirty)} files modified or untracked" if dirty else head or None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    """``slime bench rollout [flags]``. Returns 0, 2 on a bad flag, 1 with ``--strict`` and a missed target."""
    parser = build_parser()
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        parser.error(f"--modes={ns.modes!r}: expected a comma-separated subset of {','.join(MODES)}")
    try:
        wl = workload_from_args(ns)
    except ValueError as exc:
        parser.error(str(exc))
    urls = [u.strip() if u.strip().startswith("http") else f"http://{u.strip()}" for u in ns.engine_urls.split(",")] if ns.engine_urls else None
    results = _run(run_bench(wl, modes, engine_urls=urls, weights_path=ns.weights_path, overhead_samples=ns.overhead_samples, http_requests=ns.http_requests,
                             http_concurrency=ns.http_concurrency, log=lambda line: print(line, flush=True)))
    print(format_table(results), flush=True)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps(results, indent=1) + "\n")
    if ns.png:
        plot(results, ns.png)
    missed = [k for k, t in results["targets"].items() if t["met"] is False]
    return 1 if ns.strict and missed else 0


def _run(coro):
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    sys.exit(main())
