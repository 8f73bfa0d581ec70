"""Our own overhead, apart from any engine: the scheduler, and the HTTP client.

``scheduler_overhead``: sample completions per second of ``Scheduler`` + ``run_step`` (APRIL, no
overlap, 64 groups x 8 per step, 16-token responses) against an engine that answers at once in the
same process: either ``InstantPool`` (a trivial fake with the pool's interface, so the number is the
scheduler's alone) or ``SimEngine(instant=True)`` wrapped by ``SimEnginePool`` (the sim engine's own
per-request work, ~numpy hashing and token draws, is then counted too). One thread, one core.

``http_overhead``: ``HttpEnginePool.generate`` against an instant ``SimEngine`` in its own process on
loopback, next to a bare aiohttp client (one ``ClientSession``, ``session.post(json=...)``, body
read, not parsed) sending the same requests with the same concurrency. Rounds alternate (bare,
ours, bare, ours, ...) so that noise from other processes hits both; the best round of each is kept.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, Literal

import aiohttp

from slime.bench.engine_proc import sim_engine_process
from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.engines.interface import EnginePool, PauseMode
from slime.engines.pool import HttpEnginePool
from slime.engines.protocol import FinishReason, GenerateResult
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.servers.sim import SimConfig, SimEngine
from slime.train_metrics import TrainMetrics

__all__ = ["InstantPool", "SimEnginePool", "scheduler_overhead", "http_overhead"]

_STOP = FinishReason(type="stop", matched=2)


class InstantPool:
    """The ``HttpEnginePool`` interface, answering every generate at once with ``num_tokens`` tokens (EOS last)."""

    kv_cache_version: str | None = None  # no prefix cache: tokens are never tagged older
    num_prefix_cache_hits = 0

    def give_up_inflight(self, reason: str, *, running_for_s: float = 0.0) -> None:
        """None: in process, no request sits on an engine to give up on."""
        return None

    def __init__(self, num_tokens: int = 16):
        self.version = "0"
        self._ids = [3 + i for i in range(num_tokens - 1)] + [2]
        self._lps = [-0.5] * num_tokens

    async def generate(
        self, input_ids, sampling_params, *, rid=None, sticky_key=None, return_logprob=True
    ) -> GenerateResult:
        n = min(len(self._ids), sampling_params["max_new_tokens"])
        reason = _STOP if n == len(self._ids) else FinishReason(type="length", length=n)
        return GenerateResult(
            output_ids=self._ids[:n],
            output_logprobs=self._lps[:n],
            finish_reason=reason,
            weight_version=self.version,
            completion_tokens=n,
            rid=rid or "",
        )

    async def abort_all(self) -> dict:
        return {}

    async def pause_generation(self, mode: str = "abort") -> dict:
        return {}

    async def continue_generation(self) -> dict:
        return {}

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str, *, abort_all_requests: bool = False
    ) -> dict:
        self.version = weight_version
        return {}


class SimEnginePool:
    """An in-process ``SimEngine`` behind the ``HttpEnginePool`` interface (no HTTP)."""

    kv_cache_version: str | None = None  # no prefix cache: tokens are never tagged older
    num_prefix_cache_hits = 0

    def give_up_inflight(self, reason: str, *, running_for_s: float = 0.0) -> None:
        """None: in process, no request sits on an engine to give up on."""
        return None

    def __init__(self, engine: SimEngine):
        self.engine = engine

    async def generate(
        self, input_ids, sampling_params, *, rid=None, sticky_key=None, return_logprob=True
    ) -> GenerateResult:
        return await self.engine.generate(input_ids, sampling_params, rid, return_logprob=return_logprob)

    async def abort_all(self) -> dict:
        self.engine.abort_all()
        return {}

    async def pause_generation(self, mode: PauseMode = "abort") -> dict:
        self.engine.pause_generation(mode)
        return {}

    async def continue_generation(self) -> dict:
        self.engine.continue_generation()
        return {}

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str, *, abort_all_requests: bool = False
    ) -> dict:
        return await self.engine.update_weights_from_disk(
            model_path, weight_version=weight_version, abort_all_requests=abort_all_requests
        )


class _NoSync:
    def __init__(self, pool: EnginePool):
        self.pool = pool

    async def save(self, version: int) -> str:
        return f"v{version}"

    async def load(self, path: str, version: int, *, abort_all_requests: bool = True) -> None:
        await self.pool.update_weights_from_disk(path, str(version), abort_all_requests=abort_all_requests)

    async def close(self) -> None:
        """Nothing to release."""


async def _one(sample) -> float:
    return 1.0


async def scheduler_overhead(
    num_samples: int,
    *,
    engine: Literal["fake", "sim"] = "fake",
    groups_per_step: int = 64,
    n: int = 8,
    response_len: int = 16,
) -> dict[str, float]:
    """Completions/s of the scheduler (plus ``run_step``) on an instant in-process engine.

    Returns ``{"completions_per_s", "cpu_us_per_completion", "completions", "wall_s"}``; one warm-up
    step is run first and not counted.
    """
    per_step = groups_per_step * n
    steps = max(1, -(-num_samples // per_step))
    rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(1024)]
    ids = {r.prompt: [3 + (7 * r.index + j) % 1000 for j in range(32)] for r in rows}
    loop_cfg = LoopConfig(
        mode="april",
        rollout_batch_size=groups_per_step,
        over_sampling_batch_size=2 * groups_per_step,
        overlap_train=False,
        num_rollout=steps + 1,
    )
    rollout = RolloutConfig(n_samples_per_prompt=n, rollout_max_response_len=4 * response_len)
    async with _InstantEngine(engine, response_len) as pool:
        async with asyncio.TaskGroup() as tg:
            sched = Scheduler(
                loop_cfg,
                rollout,
                source=PromptSource(rows, shuffle=False),
                tokenize=ids.__getitem__,
                decode=lambda _: "",
                pool=pool,
                buffer=DataBuffer(),
                reward_fn=_one,
                task_group=tg,
            )
            sync = _NoSync(pool)
            await run_step(sched, train_step=lambda g: TrainMetrics(), sync=sync)  # warm-up
            done = 0
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(steps):
                groups, _ = await run_step(sched, train_step=lambda g: TrainMetrics(), sync=sync)
                done += sum(len(g.samples) for g in groups)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            await sched.shutdown()
    return {
        "completions_per_s": done / wall,
        "cpu_us_per_completion": 1e6 * cpu / done,
        "completions": done,
        "wall_s": wall,
    }


class _InstantEngine:
    def __init__(self, kind: str, response_len: int):
        self.kind, self.response_len = kind, response_len
        self.engine: SimEngine | None = None

    async def __aenter__(self):
        if self.kind == "fake":
            return InstantPool(self.response_len)
        self.engine = SimEngine(
            SimConfig(
                instant=True,
                response_len_median=self.response_len,
                response_len_p99=self.response_len,
                max_response_len=4 * self.response_len,
                weight_version="0",
            )
        )
        self.engine.start()
        return SimEnginePool(self.engine)

    async def __aexit__(self, *exc: object) -> None:
        if self.engine is not None:
            await self.engine.close()


def instant_sim_flags(seed: int) -> list[str]:
    return [
        "--instant",
        "--response-len-median",
        "32",
        "--response-len-p99",
        "128",
        "--max-response-len",
        "128",
        "--seed",
        str(seed),
        "--weight-version",
        "0",
    ]


async def http_overhead(num_requests: int, *, concurrency: int = 64, rounds: int = 3, seed: int = 0) -> dict[str, Any]:
    """Requests/s and client CPU/request of ``HttpEnginePool.generate`` and of bare aiohttp (same requests)."""
    prompts = [[3 + (i * 31 + j) % 30000 for j in range(32)] for i in range(256)]
    params = {"max_new_tokens": 128, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    results: dict[str, list[dict[str, float]]] = {"ours": [], "bare": []}
    async with sim_engine_process(instant_sim_flags(seed)) as proc:
        url = proc.url
        async with aiohttp.ClientSession() as session, HttpEnginePool([url], config=RolloutConfig()) as pool:
            await pool.wait_ready(30.0)

            async def bare(i: int, tag: str) -> None:
                body = {
                    "input_ids": prompts[i % len(prompts)],
                    "sampling_params": params,
                    "return_logprob": True,
                    "rid": f"{tag}-{i}-",
                }
                async with session.post(url + "/generate", json=body) as resp:
                    await resp.read()

            async def ours(i: int, tag: str) -> None:
                await pool.generate(prompts[i % len(prompts)], params, rid=f"{tag}-{i}-")

            clients = {"bare": bare, "ours": ours}
            for name, fn in clients.items():  # warm-up: open the connections
                await _drive(fn, min(num_requests, 4 * concurrency), concurrency, f"warm-{name}")
            for r in range(rounds):
                for name, fn in clients.items():
                    results[name].append(await _drive(fn, num_requests, concurrency, f"{name}{r}"))
    best = {k: max(v, key=lambda x: x["requests_per_s"]) for k, v in results.items()}
    return {
        "http_requests_per_s": best["ours"]["requests_per_s"],
        "bare_aiohttp_requests_per_s": best["bare"]["requests_per_s"],
        "ratio_vs_bare": best["ours"]["requests_per_s"] / best["bare"]["requests_per_s"],
        "ours_client_cpu_ms_per_request": best["ours"]["cpu_ms_per_request"],
        "bare_client_cpu_ms_per_request": best["bare"]["cpu_ms_per_request"],
        "rounds": results,
        "num_requests": num_requests,
        "concurrency": concurrency,
    }


async def _drive(fn, num: int, concurrency: int, tag: str) -> dict[str, float]:
    counter = itertools.count()

    async def worker() -> None:
        while (i := next(counter)) < num:
            await fn(i, tag)

    cpu0, t0 = time.process_time(), time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(worker())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"requests_per_s": num / wall, "cpu_ms_per_request": 1000.0 * cpu / num, "wall_s": wall}
