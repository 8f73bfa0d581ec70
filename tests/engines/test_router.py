"""Routing through sglang-router, and RouterClient's worker management, against a fake router.

The fake router is a ``FakeEngine`` with canned replies in the shapes of docs/sglang.md#router
(gateway ``/workers`` with ids and 202, legacy ``/list_workers`` / ``/add_worker``). It does not
forward anything: the point is what our side sends where.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from slime.config import EngineConfig, RolloutConfig
from slime.engines.fleet.supervisor import EngineSupervisor
from slime.engines.pool import ROUTING_KEY_HEADER, HttpEnginePool
from slime.engines.router import RouterClient
from tests.engines.fleet.test_supervisor import FakeProcess, serving
from tests.engines.test_client import generate_body

FAST = RolloutConfig(request_timeout_s=5.0, control_timeout_s=5.0, max_retries=1, retry_backoff_s=0.01)


async def test_generate_goes_through_the_router_with_the_routing_key_and_control_calls_go_to_workers(start_engines):
    router, w1, w2 = await start_engines(3)
    seen: list[str | None] = []

    async def route(request: web.Request) -> web.Response:
        seen.append(request.headers.get(ROUTING_KEY_HEADER))
        return web.json_response(generate_body())

    router.routes["/generate"] = route
    for w in (w1, w2):
        w.on("/abort_request", text="")
    async with HttpEnginePool([w1.url, w2.url], config=FAST, router_url=router.url) as pool:
        await pool.generate([1, 2], {}, rid="g3-s1-", sticky_key="g3-s1")
        await pool.generate([1, 2, 5], {}, rid="g3-s1-a1-", sticky_key="g3-s1")
        await pool.generate([1], {})
        await pool.abort_all()
    assert seen == ["g3-s1", "g3-s1", None]
    assert (w1.hits("/generate"), w2.hits("/generate"), router.hits("/abort_request")) == (0, 0, 0)
    assert w1.hits("/abort_request") == w2.hits("/abort_request") == 1


async def test_workers_are_listed_from_the_gateway_or_the_legacy_route(start_engines):
    gateway, legacy = await start_engines(2)
    gateway.on(
        "/workers", body={"workers": [{"id": "w-1", "url": "http://10.0.0.5:30000/", "is_healthy": True}], "total": 1}
    )
    legacy.on("/list_workers", body={"urls": ["http://10.0.0.6:30000"]})
    async with aiohttp.ClientSession() as session:
        assert await RouterClient(gateway.url, session=session, config=FAST).worker_urls() == ["http://10.0.0.5:30000"]
        assert await RouterClient(legacy.url, session=session, config=FAST).worker_urls() == ["http://10.0.0.6:30000"]
    assert [c[1] for c in legacy.calls] == ["/workers", "/list_workers"]


async def test_add_and_remove_worker_use_rest_routes_and_fall_back_to_legacy_ones(start_engines):
    gateway, legacy = await start_engines(2)
    gateway.on("/workers", status=202, body={"status": "accepted", "worker_id": "w-9"})
    gateway.on("/workers/w-9", status=202, body={"status": "accepted"})
    legacy.on("/add_worker", text="Successfully added worker")
    async with aiohttp.ClientSession() as session:
        rest = RouterClient(gateway.url, session=session, config=FAST)
        await rest.add_worker("http://h:1", worker_type="prefill", bootstrap_port=8998)
        gateway.on("/workers", body={"workers": [{"id": "w-9", "url": "http://h:1"}]})
        await rest.remove_worker("http://h:1")
        await RouterClient(legacy.url, session=session, config=FAST).add_worker("http://h:2")
    assert gateway.calls[0][:3] == (
        "POST",
        "/workers",
        {"url": "http://h:1", "worker_type": "prefill", "bootstrap_port": 8998},
    )
    assert [c[:2] for c in gateway.calls[1:]] == [("GET", "/workers"), ("DELETE", "/workers/w-9")]
    assert [c[:2] for c in legacy.calls] == [("POST", "/workers"), ("POST", "/add_worker")]


async def test_wait_ready_polls_readiness_or_health_on_routers_without_it(start_engines):
    new, old = await start_engines(2)
    replies = iter([503, 200])

    async def readiness(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready"}, status=next(replies))

    new.routes["/readiness"] = readiness
    old.on("/health", text="OK")
    async with aiohttp.ClientSession() as session:
        await RouterClient(new.url, session=session, config=FAST).wait_ready(5.0)
        await RouterClient(old.url, session=session, config=FAST).wait_ready(5.0)
    assert new.hits("/readiness") == 2 and [c[1] for c in old.calls] == ["/readiness", "/health"]


async def test_a_restarted_worker_leaves_the_router_and_is_registered_again(start_engines):
    router, worker = await start_engines(2)
    serving(worker, "0")
    router.on("/workers", body={"workers": [{"id": "w-1", "url": worker.url}]})
    router.on("/workers/w-1", status=202, body={"status": "accepted"})
    async with HttpEnginePool([worker.url], config=FAST, router_url=router.url, weights=("/ckpt", "0")) as pool:
        proc = FakeProcess("w")
        client = RouterClient(router.url, session=pool._session, config=FAST)
        supervisor = EngineSupervisor(
            pool, config=EngineConfig(health_check_interval_s=0), processes={worker.url: proc}, router=client
        )
        proc.returncode = -9
        async with asyncio.TaskGroup() as tg:
            await supervisor.check_once(tg)
            await supervisor.wait_idle()
    assert [c[:2] for c in router.calls] == [("GET", "/workers"), ("DELETE", "/workers/w-1"), ("POST", "/workers")]
    assert router.calls[-1][2] == {"url": worker.url} and proc.num_restarts == 1
