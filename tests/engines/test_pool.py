"""HttpEnginePool over several in-process fake SGLang engines (``FakeEngine`` of ``test_client.py``):
retries on another engine, sticky routing, control calls fanned out to every engine, failures naming the engine."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from slime.config import RolloutConfig
from slime.engines.pool import HttpEnginePool
from slime.errors import EngineError, EngineRequestError
from tests.engines.test_client import FAST, dead_url, generate_body


async def test_unavailable_engine_is_retried_on_the_other_one(start_engines) -> None:
    bad, good = await start_engines(2)
    bad.on("/generate", status=503, body={"object": "error", "message": "overloaded", "code": 503})
    good.on("/generate", body=generate_body("ok"))
    config = RolloutConfig(max_retries=3, retry_backoff_s=0.1)  # a failed engine cools down for 0.8 s
    async with HttpEnginePool([bad.url, good.url], config=config) as pool:
        result = await pool.generate([1], {}, rid="ok")
        assert result.rid == "ok" and (bad.hits("/generate"), good.hits("/generate")) == (1, 1)
        assert good.calls[0][2]["rid"] == "ok"
        await pool.generate([1], {})  # the failed engine is skipped while it cools down
        assert (bad.hits("/generate"), good.hits("/generate")) == (1, 2)


async def test_sticky_key_returns_to_its_engine_and_others_go_to_the_least_loaded(start_engines) -> None:
    a, b = await start_engines(2)
    a.on("/generate", body=generate_body())
    b.on("/generate", body=generate_body())
    async with HttpEnginePool([a.url, b.url], config=FAST) as pool:
        await pool.generate([1], {}, sticky_key="group-7")
        await pool.generate([1], {}, sticky_key="group-7")
        await pool.generate([1], {}, sticky_key="group-7")
        assert (a.hits("/generate"), b.hits("/generate")) == (3, 0)
        await pool.generate([1], {})
        assert b.hits("/generate") == 1


async def test_concurrent_samples_with_one_sticky_key_share_an_engine(start_engines) -> None:
    a, b = await start_engines(2)
    release = asyncio.Event()

    async def stall(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response(generate_body())

    a.routes["/generate"] = b.routes["/generate"] = stall
    async with HttpEnginePool([a.url, b.url], config=FAST) as pool:
        tasks = [asyncio.create_task(pool.generate([1], {}, sticky_key="group-1")) for _ in range(3)]
        while pool.num_inflight < 3:
            await asyncio.sleep(0)
        release.set()
        await asyncio.gather(*tasks)
    assert sorted([a.hits("/generate"), b.hits("/generate")]) == [0, 3]


async def test_abort_all_reaches_every_engine_with_a_json_body(start_engines) -> None:
    engines = await start_engines(3)
    for engine in engines:
        engine.on("/abort_request", text="")
    async with HttpEnginePool([e.url for e in engines], config=FAST) as pool:
        assert set(await pool.abort_all()) == {e.url for e in engines}
    for engine in engines:
        assert engine.calls == [("POST", "/abort_request", {"rid": "", "abort_all": True}, "application/json")]


async def test_update_weights_failure_names_the_failing_engine(start_engines) -> None:
    ok, bad = await start_engines(2)
    ok.on("/update_weights_from_disk", body={"success": True, "message": "Succeeded.", "num_paused_requests": 0})
    bad.on("/update_weights_from_disk", status=400, body={"success": False, "message": "no such file /ckpt/v3"})
    async with HttpEnginePool([ok.url, bad.url], config=FAST) as pool:
        with pytest.raises(EngineRequestError) as info:
            await pool.update_weights_from_disk("/ckpt/v3", "3")
    text = str(info.value)
    assert "1 of 2 engines" in text and f"{bad.url}/update_weights_from_disk" in text and "no such file" in text
    assert info.value.url == bad.url
    assert ok.calls[0][2] == {
        "model_path": "/ckpt/v3",
        "weight_version": "3",
        "abort_all_requests": False,
        "flush_cache": True,
    }


async def test_pool_close_is_idempotent_and_add_remove_engine_route(start_engines) -> None:
    a, b = await start_engines(2)
    b.on("/generate", body=generate_body())
    pool = HttpEnginePool([a.url], config=FAST)
    pool.add_engine(b.url + "/")
    pool.remove_engine(a.url)
    with pytest.raises(ValueError):
        pool.add_engine(b.url)
    await pool.generate([1], {})
    assert (a.hits("/generate"), b.hits("/generate")) == (0, 1)
    await pool.close()
    await pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        await pool.generate([1], {})


async def test_bulk_failure_of_mixed_kinds_is_an_engine_error_naming_both(start_engines) -> None:
    (engine,) = await start_engines()
    engine.on("/health_generate", status=400, body={"error": {"message": "nope"}})
    down = dead_url()
    async with HttpEnginePool([engine.url, down], config=FAST) as pool:
        with pytest.raises(EngineError) as info:
            await pool.wait_ready(0.3)
    assert type(info.value) is EngineError and engine.url in str(info.value) and down in str(info.value)


async def test_control_call_skips_an_unreachable_engine_but_raises_a_refusal(start_engines) -> None:
    (engine,) = await start_engines()
    engine.on("/continue_generation", status=400, body={"error": {"message": "nope"}})
    down = dead_url()
    async with HttpEnginePool([engine.url, down], config=FAST) as pool:
        with pytest.raises(EngineRequestError) as info:
            await pool.continue_generation()
        assert engine.url in str(info.value) and down not in str(info.value)
        assert [s["consecutive_failures"] for s in pool.engine_states()] == [0, 1]
