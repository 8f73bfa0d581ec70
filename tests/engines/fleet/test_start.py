"""``start_rollout`` attaching to a running router, and ``CommandProcess`` with real child processes.

The router and its workers are ``FakeEngine`` servers. The processes run a 10-line aiohttp server
(``SERVER``) that answers ``/health_generate``, so start, readiness, SIGKILL and restart are real
without SGLang.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

import aiohttp
import pytest

from slime.config import EngineConfig, RolloutConfig
from slime.engines.client import EngineClient
from slime.engines.fleet.processes import CommandProcess
from slime.engines.fleet.start import start_rollout
from slime.errors import EngineUnavailable
from tests.engines.test_client import generate_body

FAST = RolloutConfig(request_timeout_s=5.0, control_timeout_s=5.0, max_retries=1, retry_backoff_s=0.01)
SERVER = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_get("/health_generate", lambda request: web.Response(status=200))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


async def test_attaching_to_a_running_router_lists_its_workers_for_control_calls(start_engines):
    router, w1, w2 = await start_engines(3)
    router.on("/readiness", body={"status": "ready", "healthy_workers": 2, "total_workers": 2})
    router.on("/workers", body={"workers": [{"id": "a", "url": w1.url}, {"id": "b", "url": w2.url + "/"}], "total": 2})
    router.on("/generate", body=generate_body())
    for w in (w1, w2):
        w.on("/health_generate", text="")
        w.on("/abort_request", text="")
    host, port = router.url.removeprefix("http://").split(":")
    engine = EngineConfig(
        sglang_router_ip=host, sglang_router_port=int(port), health_check_interval_s=0, startup_timeout_s=5
    )
    async with start_rollout(engine, FAST, model_dir="/ckpt") as engines:
        pool = engines.pools.default
        assert engines.plan.backend == "external" and pool.router_url == router.url and pool.urls == [w1.url, w2.url]
        await pool.generate([1], {}, sticky_key="g0-s0")
        await pool.abort_all()
        with pytest.raises(KeyError, match="no engines serve model 'teacher'"):
            engines.pools["teacher"]
    assert router.hits("/generate") == 1 and w1.hits("/abort_request") == w2.hits("/abort_request") == 1
    assert router.hits("/abort_request") == 0 and "/workers" not in [c[1] for c in router.calls if c[0] != "GET"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_killed_command_process_is_restarted_on_its_port_and_one_that_dies_at_start_names_its_log(tmp_path):
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}"
        ready = EngineClient(url, session=session, config=FAST).wait_ready
        proc = CommandProcess(
            "fake-0",
            [sys.executable, str(script), str(port)],
            env={},
            url=url,
            ready=ready,
            log_path=tmp_path / "logs" / "fake-0.log",
            grace_s=5,
        )
        assert await proc.start(30) == url
        first = proc.pid
        os.kill(first, signal.SIGKILL)
        await proc.proc.wait()
        assert proc.returncode == -signal.SIGKILL
        await proc.restart(30)
        assert proc.pid != first and proc.returncode is None
        await proc.stop()
        assert proc.returncode is not None
        dead = CommandProcess(
            "dies",
            [sys.executable, "-c", "import sys; print('no GPU'); sys.exit(3)"],
            env={},
            url=url,
            ready=ready,
            log_path=tmp_path / "logs" / "dies.log",
        )
        with pytest.raises(EngineUnavailable, match=r"dies exited with code 3 before it was ready; see .*dies.log"):
            await dead.start(30)
    assert "no GPU" in (tmp_path / "logs" / "dies.log").read_text()


async def test_external_actor_engines_with_a_launched_teacher_and_with_running_teachers(start_engines, tmp_path):
    from tests.fixtures.tiny_model import write_tiny_llama

    actor, teacher = await start_engines(2)
    for e in (actor, teacher):
        e.on("/health_generate", text="")
    engine = EngineConfig(
        rollout_external_engine_addrs=(actor.url,),
        opd_teacher_addrs=(teacher.url,),
        health_check_interval_s=0,
        startup_timeout_s=5,
    )
    async with start_rollout(engine, FAST, model_dir="/ckpt") as engines:
        assert engines.pools.default.urls == [actor.url] and engines.pools["teacher"].urls == [teacher.url]
    model = write_tiny_llama(tmp_path / "teacher", seed=0)
    engine = EngineConfig(
        rollout_external_engine_addrs=(actor.url,),
        opd_teacher_load=str(model),
        health_check_interval_s=0,
        startup_timeout_s=60,
    )
    async with start_rollout(engine, FAST, model_dir="/ckpt") as engines:
        (url,) = engines.pools["teacher"].urls
        assert url not in (actor.url, teacher.url) and url in engines.processes  # launched, supervised
        result = await engines.pools["teacher"].generate(
            [0, 5, 9], {"max_new_tokens": 0, "temperature": 1.0}, logprob_start_len=2
        )
        assert result.input_token_ids == [9]


async def test_load_initial_weights_checks_each_engines_model_then_loads_the_run_weights_with_the_cache_flushed(
    start_engines, tmp_path
):
    from slime.engines.fleet.start import load_initial_weights
    from slime.engines.pool import HttpEnginePool
    from slime.errors import ConfigError

    run_model = tmp_path / "run-model"
    run_model.mkdir()
    (run_model / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32}'
    )
    a, b = await start_engines(2)
    a.on(
        "/model_info",
        body={"model_path": "/elsewhere/step-40", "weight_version": "40", "architectures": ["LlamaForCausalLM"]},
    )
    b.on(
        "/model_info", body={"model_path": "/elsewhere/base", "weight_version": "0"}
    )  # no architectures (SGLang < 0.5.10, say)
    for e in (a, b):
        e.on("/update_weights_from_disk", body={"success": True, "message": "ok"})
    async with HttpEnginePool([a.url, b.url], config=FAST) as pool:
        await load_initial_weights(pool, str(run_model), "0")
    for e in (a, b):
        (body,) = [c[2] for c in e.calls if c[1] == "/update_weights_from_disk"]
        assert body["model_path"] == str(run_model) and body["weight_version"] == "0" and body["flush_cache"] is True
    b.on(
        "/model_info",
        body={"model_path": "/elsewhere/qwen", "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"},
    )
    async with HttpEnginePool([a.url, b.url], config=FAST) as pool:
        with pytest.raises(
            ConfigError,
            match=r"serves '/elsewhere/qwen'.*architectures \['Qwen2ForCausalLM'\] \(engine\) vs "
            r"\['LlamaForCausalLM'\] \(run\); model_type 'qwen2' \(engine\) vs 'llama' \(run\)",
        ):
            await load_initial_weights(pool, str(run_model), "0")
    assert a.hits("/update_weights_from_disk") == b.hits("/update_weights_from_disk") == 1  # refused before any update


async def test_external_engines_where_nothing_listens_fail_after_a_short_grace_not_the_startup_timeout(
    monkeypatch, start_engines
):
    import time

    from slime.engines.fleet import start

    monkeypatch.setattr(start, "EXTERNAL_REFUSED_GRACE_S", 0.5)
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    engine = EngineConfig(rollout_external_engine_addrs=tuple(dead), health_check_interval_s=0, startup_timeout_s=60)
    t0 = time.monotonic()
    with pytest.raises(
        EngineUnavailable,
        match=rf"connection refused \(nothing listens there\) at every probe for 0.5s: http://{dead[0]}, http://{dead[1]}; stopped "
        r"waiting for them \(not the whole --engine-startup-timeout-s=60\); start the engines first and wait until they answer "
        r"/health_generate, or fix the address \(--rollout-external-engine-addrs\)",
    ):
        async with start_rollout(engine, FAST, model_dir="/ckpt"):
            pass
    assert time.monotonic() - t0 < 10  # before the fix: the whole 60 s
    router_port = free_port()  # a running router nobody listens for, likewise
    engine = EngineConfig(
        sglang_router_ip="127.0.0.1", sglang_router_port=router_port, health_check_interval_s=0, startup_timeout_s=60
    )
    with pytest.raises(EngineUnavailable, match=r"/readiness: connection refused .* start the router first"):
        async with start_rollout(engine, FAST, model_dir="/ckpt"):
            pass
    assert time.monotonic() - t0 < 20
    (live,) = await start_engines(1)  # one engine up, one refusing: waited for the whole timeout (here 1.5 s)
    live.on("/health_generate", text="")
    engine = EngineConfig(
        rollout_external_engine_addrs=(live.url, dead[0]), health_check_interval_s=0, startup_timeout_s=1.5
    )
    with pytest.raises(EngineUnavailable, match=r"not ready after 1.5s"):
        async with start_rollout(engine, FAST, model_dir="/ckpt"):
            pass


async def test_an_external_engine_that_accepts_connections_is_waited_for_past_the_grace(monkeypatch, start_engines):
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from slime.engines.fleet import start
    from slime.engines.probe import refuses_connections

    monkeypatch.setattr(start, "EXTERNAL_REFUSED_GRACE_S", 0.3)
    (loading,) = await start_engines(1)
    loading.on("/health_generate", status=503, text="loading")  # accepts connections, not ready yet
    asyncio.get_running_loop().call_later(1.0, loading.on, "/health_generate", 200, None, "")
    port = free_port()  # refuses at first, listens within the grace
    late = web.Application()
    late.router.add_get("/health_generate", lambda request: web.Response(status=200))
    server = TestServer(late, host="127.0.0.1", port=port)
    assert await refuses_connections(f"http://127.0.0.1:{port}")
    asyncio.get_running_loop().call_later(0.1, lambda: asyncio.ensure_future(server.start_server()))
    engine = EngineConfig(
        rollout_external_engine_addrs=(loading.url, f"127.0.0.1:{port}"),
        health_check_interval_s=0,
        startup_timeout_s=30,
    )
    try:
        async with start_rollout(engine, FAST, model_dir="/ckpt") as engines:
            assert engines.pools.default.urls == [loading.url, f"http://127.0.0.1:{port}"]
        assert loading.hits("/health_generate") >= 2 and not await refuses_connections(loading.url)
    finally:
        await server.close()
