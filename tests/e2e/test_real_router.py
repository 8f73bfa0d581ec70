"""A real sglang-router (the ``sglang-router`` wheel) in front of two embedded engines.

Skipped unless ``sglang_router`` imports (it is not a dependency: ``pip install sglang-router``).
Checked against 0.3.2: the router command of the launch plan starts and gets ready; ``GET /workers``
lists both engines; ``X-SMG-Routing-Key`` with ``--policy manual`` (0.3.2's sticky-key policy)
keeps every key on one engine; control calls reach the engines, not the router; after a SIGKILL
the supervisor relaunches the engine, deregisters and registers it again, and the router routes
to it. The engines start at different ``weight_version`` strings so each reply says who served it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import aiohttp
import pytest

from slime.config import EngineConfig, RolloutConfig
from slime.engines.fleet.processes import CommandProcess, EmbeddedEngineProcess
from slime.engines.fleet.supervisor import EngineSupervisor
from slime.engines.pool import HttpEnginePool
from slime.engines.router import RouterClient
from tests.fixtures.tiny_model import write_tiny_llama

pytest.importorskip("sglang_router")
CONFIG = RolloutConfig(request_timeout_s=30, control_timeout_s=10, max_retries=3, retry_backoff_s=0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_real_router_routes_by_key_lists_workers_and_follows_a_restart(tmp_path):
    model = str(write_tiny_llama(tmp_path / "model", seed=0))
    engines = [EmbeddedEngineProcess(model, seed=i, weight_version=v) for i, v in enumerate(["7", "9"])]
    urls = list(await asyncio.gather(*(e.start(90) for e in engines)))
    port = free_port()
    async with aiohttp.ClientSession() as session:
        client = RouterClient(f"http://127.0.0.1:{port}", session=session, config=CONFIG)
        argv = [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--worker-urls",
            *urls,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            "manual",
            "--health-check-interval-secs",
            "1",
        ]
        router = CommandProcess(
            "router", argv, env={}, url=client.url, ready=client.wait_ready, log_path=tmp_path / "router.log"
        )
        try:
            await router.start(60)
            await asyncio.wait_for(_until_listed(client, urls), 30)
            async with HttpEnginePool(
                urls, config=CONFIG, session=session, router_url=client.url, weights=(model, "7")
            ) as pool:
                served = {}
                for key in [f"g{i}-s0" for i in range(8)] * 3:
                    result = await pool.generate([0, 5, 6], {"max_new_tokens": 2}, sticky_key=key)
                    served.setdefault(key, set()).add(result.weight_version)
                assert all(len(v) == 1 for v in served.values()), served
                assert set().union(*served.values()) == {"7", "9"}  # both engines got keys
                await pool.update_weights_from_disk(model, "7")  # one version everywhere, as in a run
                supervisor = EngineSupervisor(
                    pool,
                    config=EngineConfig(health_check_interval_s=0, startup_timeout_s=90),
                    processes={urls[0]: engines[0]},
                    router=client,
                )
                old_pid = engines[0].pid
                os.kill(old_pid, signal.SIGKILL)
                await engines[0].proc.wait()
                async with asyncio.TaskGroup() as tg:
                    await supervisor.check_once(tg)
                    await supervisor.wait_idle()
                assert engines[0].pid != old_pid and supervisor.events[-1][0] == "restarted"
                await asyncio.wait_for(_until_listed(client, urls), 30)
                await pool.abort_all()
                result = await pool.generate([0, 5], {"max_new_tokens": 2}, sticky_key="after-restart")
                assert result.finish_reason.type in ("stop", "length")
        finally:
            await router.stop()
            await asyncio.gather(*(e.stop() for e in engines))


async def _until_listed(client: RouterClient, urls: list[str]) -> None:
    while True:
        workers = await client.list_workers()
        if sorted(w["url"] for w in workers if w.get("is_healthy", True)) == sorted(urls):
            return
        await asyncio.sleep(0.2)
