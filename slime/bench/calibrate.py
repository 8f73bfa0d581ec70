"""Calibrating the simulated engine to a real one: decode step cost = a + b x running requests.

``probe_decode_cost`` measures a real engine (any ``HttpEnginePool``-like ``generate``) before the
modes run: for each batch size B it sends B requests at once twice, with ``max_new_tokens`` =
``short`` and then ``long`` (``ignore_eos``, fresh random prompts of ``prompt_len`` tokens, so no
prefix-cache hit), and takes::

    step_ms(B) = (wall(B, long) - wall(B, short)) / (long - short) * 1000

The difference cancels the prefill, the HTTP round trip and the queueing of the B arrivals; the
decode steps it times run at contexts of prompt_len + short .. prompt_len + long tokens. A line
fitted by least squares through (B, step_ms(B)) gives ``decode_step_ms`` (a) and
``decode_step_per_req_ms`` (b), the simulated engine's cost parameters (``SimConfig``). Prefill:
``prefill_batch`` requests of ``prefill_len`` random tokens and 1 new token against the same with
``prompt_len`` tokens, median of 3 rounds, gives ``prefill_ms_per_token`` (c).

Every probe request must come back with exactly ``max_new_tokens`` tokens: the probe raises
otherwise (an engine that ignores ``ignore_eos`` would make every length of the benchmark wrong).

``probe_engines`` runs the probe against engines by URL (``slime bench rollout --calibrate-sim``, with
``ProbeConfig``'s batch sizes and lengths).

Example: steps of 1.98 ms at 1 running, 2.57 at 64, 4.44 at 256 (Qwen2-0.5B shape, bf16, H200) fit
a = 1.95 ms, b = 0.0096 ms.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from slime.bench.workload import Workload
from slime.engines.interface import GeneratePool
from slime.engines.pool import HttpEnginePool

__all__ = ["DecodeCost", "ProbeConfig", "fit_decode_cost", "probe_decode_cost", "probe_engines", "calibrated_workload"]


class DecodeCost(msgspec.Struct, kw_only=True, frozen=True):
    """A fitted cost model (simulated ms = real ms) and the points it was fitted to."""

    decode_step_ms: float
    decode_step_per_req_ms: float
    r2: float
    """Coefficient of determination of the line through ``points`` (1.0: exact)."""
    points: list[tuple[int, float]]
    """[(running requests, measured ms per decode step)]."""
    prefill_ms_per_token: float | None = None


def fit_decode_cost(points: Sequence[tuple[int, float]], *, prefill_ms_per_token: float | None = None) -> DecodeCost:
    """Least-squares line ``ms = a + b * running`` through ``points``; a and b clipped at 0.

    Raises:
        ValueError: fewer than two distinct batch sizes.
    """
    xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
    if len(set(xs)) < 2:
        raise ValueError(f"need points at two or more batch sizes, got {list(points)}")
    b, a = statistics.linear_regression(xs, ys)
    r2 = statistics.correlation(xs, ys) ** 2 if len(set(ys)) > 1 else 1.0
    return DecodeCost(
        decode_step_ms=max(a, 0.0),
        decode_step_per_req_ms=max(b, 0.0),
        r2=r2,
        points=[(int(x), y) for x, y in points],
        prefill_ms_per_token=prefill_ms_per_token,
    )


class ProbeConfig(msgspec.Struct, kw_only=True, frozen=True):
    """The decode-cost probe of ``slime bench rollout --calibrate-sim`` (``probe_decode_cost``'s arguments)."""

    batch_sizes: tuple[int, ...]
    prompt_len: int = 512
    short: int = 16
    long: int = 272


TimedRound = Callable[[int, int, int], Awaitable[float]]
"""``(batch, prompt tokens, max_new_tokens)`` -> wall seconds of that many probe requests sent at once."""


def _timed_round(pool: GeneratePool, seed: int) -> TimedRound:
    """One probe round against ``pool``: fresh random prompts (seeded), ``ignore_eos``, timed end to end.

    The round raises RuntimeError when a request does not return exactly ``max_new_tokens`` tokens.
    """
    rng = random.Random(seed)
    counter = iter(range(1 << 62))

    async def timed(batch: int, num_prompt: int, max_new: int) -> float:
        prompts = [[rng.randrange(3, 30000) for _ in range(num_prompt)] for _ in range(batch)]
        params = {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 1.0}
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(pool.generate(p, params, rid=f"slime-probe-{next(counter)}-", return_logprob=False) for p in prompts)
        )
        wall = time.perf_counter() - t0
        bad = [len(r.output_ids) for r in results if len(r.output_ids) != max_new]
        if bad:
            raise RuntimeError(
                f"probe: {len(bad)} of {batch} requests returned {bad[:4]} tokens, not max_new_tokens={max_new} "
                "(does the engine honour ignore_eos?)"
            )
        return wall

    return timed


async def probe_decode_cost(
    pool: GeneratePool,
    *,
    batch_sizes: Sequence[int] = (1, 32, 64, 128, 256),
    prompt_len: int = 512,
    short: int = 16,
    long: int = 272,
    prefill_len: int = 2048,
    prefill_batch: int = 8,
    seed: int = 0,
    log=print,
) -> DecodeCost:
    """Measure the engine behind ``pool`` (idle, weights loaded) and fit its decode cost.

    Args:
        pool: ``generate(input_ids, sampling_params, *, rid=, return_logprob=)`` -> ``GenerateResult``.
        batch_sizes: requests running together; each must be <= the engine's running cap.
        prompt_len: tokens of each decode-probe prompt; short / long: ``max_new_tokens`` of the two rounds.
        prefill_len / prefill_batch: the prefill probe (0 batch: skipped).

    Raises:
        RuntimeError: a request did not return exactly ``max_new_tokens`` tokens.
        ValueError: ``long <= short`` or fewer than two batch sizes.
    """
    if long <= short:
        raise ValueError(f"long={long} must be > short={short}")
    timed = _timed_round(pool, seed)
    await timed(max(batch_sizes), prompt_len, short)  # warm-up
    points = []
    for batch in batch_sizes:
        t_short = await timed(batch, prompt_len, short)
        t_long = await timed(batch, prompt_len, long)
        step_ms = 1000.0 * (t_long - t_short) / (long - short)
        points.append((batch, step_ms))
        log(
            f"probe: {batch:>4} running: {step_ms:.3f} ms per decode step ({t_short:.2f} s for {short} tokens, {t_long:.2f} s for {long})"
        )
    prefill = None
    if prefill_batch > 0 and prefill_len > prompt_len:
        rounds = [
            (await timed(prefill_batch, prefill_len, 1)) - (await timed(prefill_batch, prompt_len, 1)) for _ in range(3)
        ]
        prefill = max(0.0, 1000.0 * statistics.median(rounds) / (prefill_batch * (prefill_len - prompt_len)))
        log(f"probe: prefill {prefill * 1000:.2f} us per token ({prefill_batch} x {prefill_len} tokens)")
    return fit_decode_cost(points, prefill_ms_per_token=prefill)


async def probe_engines(
    engine_urls: list[str], wl: Workload, probe: ProbeConfig, *, seed: int, log: Callable[[str], None]
) -> DecodeCost:
    """The decode cost (a + b x running) of the real engines at ``engine_urls``, probed at ``probe``'s batch sizes
    through an ``HttpEnginePool`` of ``wl``'s rollout config, and logged."""
    async with HttpEnginePool(engine_urls, config=wl.rollout_config()) as pool:
        await pool.wait_ready(60.0)
        t0 = time.monotonic()
        cost = await probe_decode_cost(
            pool,
            batch_sizes=probe.batch_sizes,
            prompt_len=probe.prompt_len,
            short=probe.short,
            long=probe.long,
            seed=seed,
            log=log,
        )
    log(
        f"calibration: decode step = {cost.decode_step_ms:.3f} + {cost.decode_step_per_req_ms:.5f} x running ms "
        f"(r2 {cost.r2:.3f}; probe {time.monotonic() - t0:.1f} s)"
    )
    return cost


def calibrated_workload(wl: Workload, cost: DecodeCost, *, weight_sync_ms: float, time_scale: float) -> Workload:
    """``wl`` on a simulated engine with the measured costs (simulated ms = real ms), run at ``time_scale``."""
    prefill = wl.prefill_ms_per_token if cost.prefill_ms_per_token is None else cost.prefill_ms_per_token
    return msgspec.structs.replace(
        wl,
        decode_step_ms=cost.decode_step_ms,
        decode_step_per_req_ms=cost.decode_step_per_req_ms,
        prefill_ms_per_token=prefill,
        weight_sync_ms=max(0.0, weight_sync_ms),
        time_scale=time_scale,
    )
