"""``slime bench rollout``: sync vs APRIL vs fully async on the long-tail workload, side by side.

One invocation runs every mode in ``--modes`` on the same engine config (a fresh simulated engine
process per mode, or the running engines of ``--engine-urls``, e.g. a real SGLang), the same
prompts, the same seed and the same per-sample response lengths (drawn by the client and enforced
per request, ``lengths.py``), with the real ``Scheduler`` and ``slime.loop.step.run_step``; then
measures our own overhead (scheduler completions per CPU-second, i.e. on one core, on an instant
in-process engine, with the wall-time rate beside it in ``scheduler``; ``HttpEnginePool`` vs bare
aiohttp on loopback).

Per mode (``modes.py``): ``delivered_tokens_per_s`` (response tokens handed to the trainer / wall
time of the whole loop: rollout, train steps and weight syncs), ``samples_per_s``,
``engine_occupancy`` (client side, ``occupancy.py``: time-average of requests in flight, capped at
``--max-running-requests``, / that cap; the same measure for every engine), ``slot_utilization``
(simulated engine only, its ``/sim_stats``), ``step_time_p50_s`` / ``step_time_p99_s``,
``lag_histogram`` and ``off_policy_token_fraction`` over trained tokens, ``wasted_tokens``,
``client_cpu_ms_per_request`` (``time.process_time()`` of this process over the loop /
``/generate`` requests issued; the engine is another process), requests issued, aborted and resumed
samples, ``length_mismatch_samples`` (delivered samples whose length differs from their draw: 0).

Real engines (``--engine-urls URL,... --weights-path DIR``): the modes run at time scale 1, the
train step sleeps ``--train-s`` wall seconds and each weight update loads DIR with
``weight_version`` = the new version. ``--calibrate-sim`` first probes the engines' decode cost
(``calibrate.py``: ms per step = a + b x running), then, after the real modes, runs the same modes
on a simulated engine with that cost (and the measured prefill and weight-load times) at
``--time-scale``, and reports per mode real vs simulated delivered tokens per second of engine
time and the simulator's relative error (``sim_vs_real``).

JSON (``--json``)::

    {"modes": {"sync": {...}, "april": {...}, "async": {...}}, "scheduler_completions_per_s": N,
     "http_requests_per_s": N, "bare_aiohttp_requests_per_s": N,
     "speedup_vs_sync": {...}, "http_ratio_vs_bare": x, "targets": {...}, "workload": {...}, ...,
     # with --calibrate-sim:
     "calibration": {"decode_step_ms", "decode_step_per_req_ms", "r2", "points", "prefill_ms_per_token",
                     "weight_sync_ms"}, "sim_modes": {...}, "sim_workload": {...},
     "sim_vs_real": {mode: {"real_tokens_per_s", "sim_tokens_per_s", "rel_error", ...}}}

The targets (``rollout_table.TARGETS``, on real engines ``REAL_ENGINE_TARGETS``) end the table, each met or
MISSED (``--strict``: exit 1 on a miss); the speedup and slot-utilization ones are meant for the standard
workload (the defaults), so a run off it (a short ``--steps 2``, other lengths) labels them ``n/a (off the
standard workload: --steps 2 (standard 10))`` instead (``rollout_table.off_standard``).

Usage: ``slime bench rollout [--steps 10] [--modes sync,april,async] [--json PATH] [--png PATH]``
(``python -m slime.bench.rollout`` is the same). The standard run takes ~20 minutes. On one H200
with SGLang: ``scripts/gpu/bench_rollout_sglang.sh``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from slime.bench.calibrate import DecodeCost, ProbeConfig, calibrated_workload, probe_engines
from slime.bench.modes import Mode, run_mode
from slime.bench.overhead import http_overhead, scheduler_overhead
from slime.bench.rollout_table import (
    REAL_ENGINE_TARGETS,
    TARGETS,
    check_targets,
    format_table,
    off_standard,
    plot,
    sim_vs_real,
)
from slime.bench.run_meta import loadavg, run_meta
from slime.bench.workload import MODES, Workload
from slime.obs import strict_json
from slime.types import JsonObject

__all__ = ["main", "build_parser", "run_bench"]


def _cost_note(d: Workload) -> str:
    """What a default run costs in wall time (``--help``'s epilog)."""
    return (
        f"Time: every mode sleeps one simulated train step per step, --train-s {d.train_s:g} engine seconds = "
        f"{d.train_s / d.time_scale:g} wall seconds at --time-scale {d.time_scale:g}, and rolls out "
        f"{d.rollout_batch_size} x {d.n_samples_per_prompt} samples with a long tail (p99 {d.p99:g} tokens) per step. "
        f"A default run ({d.steps} steps x {len(MODES)} modes, then the overhead measurements) takes about 20 minutes; "
        "--steps 2 still takes about 5. Shorter: fewer --modes, a smaller --train-s (e.g. 5) and --steps."
    )


def build_parser() -> argparse.ArgumentParser:
    d = Workload()
    p = argparse.ArgumentParser(
        prog="slime bench rollout",
        description=__doc__.split("\n\n")[0],
        epilog=_cost_note(d),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of sync,april,async")
    p.add_argument("--steps", type=int, default=d.steps, help="rollout steps per mode")
    p.add_argument(
        "--time-scale",
        type=float,
        default=d.time_scale,
        help="simulated time / wall time of the simulated engine (real engines: always 1)",
    )
    p.add_argument(
        "--train-s",
        type=float,
        default=d.train_s,
        help="engine seconds of the simulated train step, slept as --train-s / --time-scale wall seconds every step of every mode",
    )
    p.add_argument("--rollout-batch-size", type=int, default=d.rollout_batch_size, help="groups per step")
    p.add_argument("--n-samples-per-prompt", type=int, default=d.n_samples_per_prompt, help="samples per group")
    p.add_argument(
        "--max-running-requests",
        type=int,
        default=d.max_running_requests,
        help="engine running cap (sim engine; with --engine-urls: the servers' total, for the occupancy)",
    )
    p.add_argument(
        "--decode-step-ms", type=float, default=d.decode_step_ms, help="sim engine: fixed ms of a decode step"
    )
    p.add_argument(
        "--decode-step-per-req-ms",
        type=float,
        default=d.decode_step_per_req_ms,
        help="sim engine: ms per running request per step",
    )
    p.add_argument(
        "--prefill-ms-per-token", type=float, default=d.prefill_ms_per_token, help="sim engine: ms per prefilled token"
    )
    p.add_argument("--weight-sync-ms", type=float, default=d.weight_sync_ms, help="sim engine: ms of one weight load")
    p.add_argument("--median", type=float, default=d.median, help="median response length, tokens")
    p.add_argument("--p99", type=float, default=d.p99, help="99th percentile response length, tokens")
    p.add_argument("--max-len", type=int, default=d.max_len, help="response length cap (rollout_max_response_len)")
    p.add_argument("--seed", type=int, default=d.seed, help="engine and prompt seed")
    p.add_argument("--april-over-sampling", type=int, default=d.april_over_sampling, help="groups in flight in april")
    p.add_argument(
        "--april-overlap-train",
        action=argparse.BooleanOptionalAction,
        default=d.april_overlap_train,
        help="april keeps generating during the train step (--no-april-overlap-train: classic APRIL)",
    )
    p.add_argument("--async-capacity", type=int, default=d.async_capacity, help="groups in flight in async")
    p.add_argument("--async-max-staleness", type=int, default=d.async_max_staleness, help="max_staleness of async")
    p.add_argument(
        "--engine-urls", default=None, help="comma-separated running engines instead of a fresh sim engine per mode"
    )
    p.add_argument(
        "--weights-path",
        default=None,
        help="checkpoint dir loaded by /update_weights_from_disk at each mode's start and after every step; "
        "needed with real engines (the sim engine reads nothing)",
    )
    p.add_argument(
        "--calibrate-sim",
        action="store_true",
        help="with --engine-urls: probe the decode cost first, then run the modes on a simulated engine calibrated to it",
    )
    p.add_argument(
        "--probe-batch-sizes", default=None, help="running requests probed (none given: 1 and cap/8, /4, /2, /1)"
    )
    p.add_argument("--probe-prompt-len", type=int, default=512, help="prompt tokens of each probe request")
    p.add_argument("--probe-tokens", default="16,272", help="max_new_tokens of the short and long probe rounds")
    p.add_argument("--overhead-samples", type=int, default=50_000, help="scheduler-overhead completions (0: skip)")
    p.add_argument("--http-requests", type=int, default=5_000, help="requests per HTTP-overhead round (0: skip)")
    p.add_argument("--http-concurrency", type=int, default=64)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--png", default=None, help="write the chart here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return p


def workload_from_args(ns: argparse.Namespace) -> Workload:
    return Workload(
        steps=ns.steps,
        time_scale=ns.time_scale,
        train_s=ns.train_s,
        median=ns.median,
        p99=ns.p99,
        max_len=ns.max_len,
        seed=ns.seed,
        april_over_sampling=ns.april_over_sampling,
        april_overlap_train=ns.april_overlap_train,
        async_capacity=ns.async_capacity,
        async_max_staleness=ns.async_max_staleness,
        rollout_batch_size=ns.rollout_batch_size,
        n_samples_per_prompt=ns.n_samples_per_prompt,
        max_running_requests=ns.max_running_requests,
        decode_step_ms=ns.decode_step_ms,
        decode_step_per_req_ms=ns.decode_step_per_req_ms,
        prefill_ms_per_token=ns.prefill_ms_per_token,
        weight_sync_ms=ns.weight_sync_ms,
    )


def probe_from_args(ns: argparse.Namespace, cap: int) -> ProbeConfig:
    """Raises ValueError on a malformed ``--probe-*`` value."""
    if ns.probe_batch_sizes:
        sizes = tuple(int(x) for x in ns.probe_batch_sizes.split(","))
    else:
        sizes = tuple(sorted({1, *(max(1, cap // k) for k in (8, 4, 2, 1))}))
    tokens = [int(x) for x in ns.probe_tokens.split(",")]
    short, long = (tokens + [0, 0])[:2]
    if len(tokens) != 2 or not 1 <= short < long:
        raise ValueError(f"--probe-tokens={ns.probe_tokens}: expected SHORT,LONG with 1 <= SHORT < LONG")
    if min(sizes) < 1 or max(sizes) > cap or len(set(sizes)) < 2:
        raise ValueError(
            f"--probe-batch-sizes={ns.probe_batch_sizes}: two or more sizes, each in [1, --max-running-requests={cap}]"
        )
    return ProbeConfig(batch_sizes=sizes, prompt_len=ns.probe_prompt_len, short=short, long=long)


def completions_per_core_s(sched: dict[str, float]) -> float:
    """Scheduler completions per CPU-second of the bench process: the rate on one core.

    The scheduler runs on one event-loop thread and the instant engine is in-process, so the
    process's CPU time is one core's work (engine included: conservative). On a shared machine the
    wall-time rate (``sched["completions_per_s"]``) also counts time the process waited for a core.
    """
    return 1e6 / sched["cpu_us_per_completion"]


async def run_bench(
    wl: Workload,
    modes: list[Mode],
    *,
    engine_urls: list[str] | None = None,
    weights_path: str | None = None,
    overhead_samples: int = 50_000,
    http_requests: int = 5_000,
    http_concurrency: int = 64,
    probe: ProbeConfig | None = None,
    log: Callable[[str], None] = print,
) -> JsonObject:
    """Run the overhead measurements, then every mode; return the results dict (see module doc).

    With ``engine_urls`` the modes run at time scale 1 (``wl.time_scale`` is then the calibrated
    simulated engine's); ``probe`` (real engines only) adds the calibration and the simulated run.
    """
    results: JsonObject = {
        "modes": {},
        "scheduler_completions_per_s": None,
        "http_requests_per_s": None,
        "bare_aiohttp_requests_per_s": None,
    }
    meta = run_meta(engine_urls)
    if probe is not None and engine_urls is None:
        raise ValueError("calibrating the simulated engine needs real engines (--engine-urls)")
    await _overheads(
        results,
        wl,
        overhead_samples=overhead_samples,
        http_requests=http_requests,
        http_concurrency=http_concurrency,
        log=log,
    )
    run_wl = wl if engine_urls is None else msgspec.structs.replace(wl, time_scale=1.0)
    cost = None
    if probe is not None and engine_urls is not None:  # a probe without engine_urls raised above
        cost = await probe_engines(engine_urls, run_wl, probe, seed=wl.seed, log=log)
    for mode in modes:
        results["modes"][mode] = await run_mode(
            mode, run_wl, engine_urls=engine_urls, weights_path=weights_path, log=log
        )
    _speedups(results["modes"])
    if results["modes"].get("sync"):
        results["speedup_vs_sync"] = {mode: m["speedup_vs_sync"] for mode, m in results["modes"].items()}
    if cost is not None:
        await _sim_modes(results, wl, cost, modes, log=log)
    results["targets"] = check_targets(
        results,
        REAL_ENGINE_TARGETS if engine_urls else TARGETS,
        off_workload=off_standard(wl, real_engine=engine_urls is not None),
    )
    results["workload"] = msgspec.to_builtins(run_wl)
    meta["loadavg_end"] = loadavg()
    results["meta"] = meta
    return results


async def _overheads(
    results: JsonObject,
    wl: Workload,
    *,
    overhead_samples: int,
    http_requests: int,
    http_concurrency: int,
    log: Callable[[str], None],
) -> None:
    """The scheduler's completions per CPU-second and HttpEnginePool against bare aiohttp, into ``results`` (0: skipped)."""
    if overhead_samples > 0:
        results["scheduler"] = await scheduler_overhead(overhead_samples, engine="fake")
        results["scheduler_sim_engine"] = await scheduler_overhead(overhead_samples, engine="sim")
        results["scheduler_completions_per_s"] = completions_per_core_s(results["scheduler"])
        log(
            f"scheduler: {results['scheduler_completions_per_s']:,.0f} completions per CPU-second on an instant in-process engine "
            f"({results['scheduler']['completions_per_s']:,.0f}/s of wall time)"
        )
    if http_requests > 0:
        http = await http_overhead(http_requests, concurrency=http_concurrency, seed=wl.seed)
        results["http"] = http
        results["http_requests_per_s"] = http["http_requests_per_s"]
        results["bare_aiohttp_requests_per_s"] = http["bare_aiohttp_requests_per_s"]
        results["http_ratio_vs_bare"] = http["ratio_vs_bare"]
        log(
            f"http: HttpEnginePool {http['http_requests_per_s']:,.0f} req/s vs bare aiohttp {http['bare_aiohttp_requests_per_s']:,.0f} req/s"
        )


async def _sim_modes(
    results: JsonObject, wl: Workload, cost: DecodeCost, modes: list[Mode], *, log: Callable[[str], None]
) -> None:
    """Every mode again on the simulated engine calibrated to ``cost``, and the simulator-vs-real comparison."""
    loads = [s for m in results["modes"].values() for s in m["weight_load_s"]]
    weight_sync_ms = 1000.0 * statistics.median(loads) if loads else wl.weight_sync_ms
    sim_wl = calibrated_workload(wl, cost, weight_sync_ms=weight_sync_ms, time_scale=wl.time_scale)
    results["calibration"] = {**msgspec.to_builtins(cost), "weight_sync_ms": weight_sync_ms}
    results["sim_workload"] = msgspec.to_builtins(sim_wl)
    results["sim_modes"] = {}
    for mode in modes:
        results["sim_modes"][mode] = await run_mode(mode, sim_wl, log=lambda line: log(f"[sim] {line}"))
    _speedups(results["sim_modes"])
    results["sim_vs_real"] = sim_vs_real(results["modes"], results["sim_modes"])


def _speedups(modes: dict[str, JsonObject]) -> None:
    """``speedup_vs_sync`` of each mode: delivered tokens/s over sync's (when sync ran)."""
    sync = modes.get("sync")
    if sync:
        for m in modes.values():
            m["speedup_vs_sync"] = m["delivered_tokens_per_s"] / sync["delivered_tokens_per_s"]


def main(argv: list[str] | None = None) -> int:
    """``slime bench rollout [flags]``. Returns 0, 2 on a bad flag, 1 with ``--strict`` and a missed target."""
    parser = build_parser()
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        parser.error(f"--modes={ns.modes!r}: expected a comma-separated subset of {','.join(MODES)}")
    if ns.calibrate_sim and not ns.engine_urls:
        parser.error("--calibrate-sim needs --engine-urls (a real engine to calibrate against)")
    if ns.engine_urls and not ns.weights_path:
        parser.error("--engine-urls needs --weights-path (the checkpoint each weight update loads)")
    try:
        wl = workload_from_args(ns)
        probe = probe_from_args(ns, wl.max_running_requests) if ns.calibrate_sim else None
    except ValueError as exc:
        parser.error(str(exc))
    urls = (
        [u.strip() if u.strip().startswith("http") else f"http://{u.strip()}" for u in ns.engine_urls.split(",")]
        if ns.engine_urls
        else None
    )
    results = _run(
        run_bench(
            wl,
            modes,
            engine_urls=urls,
            weights_path=ns.weights_path,
            overhead_samples=ns.overhead_samples,
            http_requests=ns.http_requests,
            http_concurrency=ns.http_concurrency,
            probe=probe,
            log=lambda line: print(line, flush=True),
        )
    )
    print(format_table(results), flush=True)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(strict_json.dumps(results, indent=1) + "\n")  # NaN/inf as null
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
