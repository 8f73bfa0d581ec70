"""An engine killed with SIGKILL mid-rollout: the run goes on, the engine is relaunched and re-synced.

Two embedded engines run as subprocesses (``start_rollout``, the driver's path) on the tiny random
model; the APRIL scheduler runs a few steps with disk weight sync (each version a perturbed copy of
the model). During step 2, once requests are in flight on engine 0, its process gets SIGKILL.
Must hold: every step completes; the supervisor relaunches the engine (a new pid serves the same
URL) and re-syncs it to the current weights and version before it serves again, then it takes
requests; each started group is trained exactly once or still pending at the end; and every
sample keeps its earlier tokens (a resent request carries prompt + partial response).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from slime.config import EngineConfig, LoopConfig, RolloutConfig, SyncConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.engines.fleet.start import start_rollout
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.rollout.generate import generate
from slime.sync.disk import DiskWeightSync
from slime.train_metrics import TrainMetrics
from tests.fixtures.tiny_model import perturb_weights, write_tiny_llama

ROLLOUT = RolloutConfig(
    n_samples_per_prompt=4, rollout_max_response_len=24, request_timeout_s=60, max_retries=3, retry_backoff_s=0.05
)
LOOP = LoopConfig(mode="april", rollout_batch_size=4, over_sampling_batch_size=8, num_rollout=4, max_staleness=2)


async def count_w7(sample):
    words = sample.response.split()
    return sum(w == "w7" for w in words) / max(1, len(words))


async def until(predicate, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_a_killed_engine_is_relaunched_at_the_current_version_and_no_group_is_lost_or_trained_twice(tmp_path):
    from transformers import AutoTokenizer

    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = [PromptRow(index=i, prompt=f"w{3 + i % 20} w{5 + i % 7} w9") for i in range(200)]
    engine_cfg = EngineConfig(
        hf_checkpoint=str(model),
        num_engines=2,
        startup_timeout_s=90,
        health_check_interval_s=0.5,
        health_check_timeout_s=10,
        circuit_breaker_threshold=2,
        circuit_breaker_cooldown_s=0.5,
    )
    trained: list[int] = []
    prefix_violations: list[str] = []

    def train_step(groups):
        trained.extend(g.group_id for g in groups)
        return TrainMetrics()

    async def checked_generate(sample, params, **kw):
        before = list(sample.response_ids)
        out = await generate(sample, params, **kw)
        if sample.response_ids[: len(before)] != before:
            prefix_violations.append(f"group {sample.group_id} sample {sample.index}")
        return out

    async with start_rollout(
        engine_cfg, ROLLOUT, model_dir=str(model), weight_version="0", log_dir=tmp_path / "logs"
    ) as engines:
        pool, supervisor = engines.pools.default, engines.supervisors["actor"]
        victim_url = pool.urls[0]
        victim = engines.processes[victim_url]
        old_pid = victim.pid
        rejoins: list[tuple[str, str | None]] = []
        rejoin = pool.rejoin

        async def rejoin_then_check(url: str) -> None:  # what the engine holds as it goes back into rotation
            await rejoin(url)
            async with pool.weights_lock:
                rejoins.append((str((await pool.client(url).model_info())["weight_version"]), pool.latest_version))

        pool.rejoin = rejoin_then_check
        sync = DiskWeightSync(
            SyncConfig(weights_dir=str(tmp_path / "weights")),
            pool=pool,
            save_fn=lambda out: perturb_weights(model, out, seed=len(os.listdir(tmp_path / "weights")), scale=0.05),
        )
        buffer, version = DataBuffer(), 0

        async def kill_when_busy() -> None:
            await until(lambda: pool.client(victim_url).num_inflight >= 2, timeout_s=60)
            os.kill(old_pid, signal.SIGKILL)

        async with asyncio.TaskGroup() as tg:
            sched = Scheduler(
                LOOP,
                ROLLOUT,
                source=PromptSource(rows, shuffle=False, seed=0),
                pool=pool,
                buffer=buffer,
                tokenize=lambda t: tokenizer.encode(t, add_special_tokens=False),
                decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                reward_fn=count_w7,
                task_group=tg,
                generate_fn=checked_generate,
            )
            killer = None
            for step in (1, 2, 3):
                if step == 2:  # kill while it is busy, in step 2 or 3 (whichever catches it generating)
                    killer = tg.create_task(kill_when_busy())
                await run_step(sched, train_step=train_step, sync=sync)
                version = sched.version.engines
            await killer
            await until(lambda: any(e[0] == "restarted" for e in supervisor.events), timeout_s=90)
            assert len(rejoins) == 1 and rejoins[0][0] == rejoins[0][1] != "0"  # re-synced from the launch version 0
            revived = pool.client(victim_url)
            info = await revived.model_info()  # back in rotation: already at the current weights and version
            assert info["weight_version"] == str(version) and info["model_path"] == str(
                Path(tmp_path / "weights" / f"v{version}")
            )
            picks = lambda: next(r["num_picks"] for r in pool.engine_states() if r["url"] == victim_url)  # noqa: E731
            picks_before = picks()
            for _ in range(3):  # a step may be served from groups already finished; run until it generates
                await run_step(sched, train_step=train_step, sync=sync)
                version = sched.version.engines
                if picks() > picks_before:
                    break
            await sched.shutdown()

        picks_after = picks()
        assert victim.pid != old_pid and victim.returncode is None and victim.url == victim_url
        assert (await revived.model_info())["weight_version"] == str(version)
        assert picks_after > picks_before  # the relaunched engine served requests after it came back
        assert pool.num_failovers > 0 and [e[0] for e in supervisor.events][-1] == "restarted"
    started = set(range(sched.next_group_id))
    pending = [g.group_id for g in [*buffer.ready, *buffer.partial_groups(), *sched.inflight.values()]]
    assert len(trained) == 4 * version and len(set(trained)) == len(trained)  # 4 groups a step, none twice
    assert (
        not set(trained) & set(pending) and set(trained) | set(pending) == started and len(pending) == len(set(pending))
    )
    assert prefix_violations == []
