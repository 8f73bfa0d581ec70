"""EngineClient and HttpEnginePool against small in-process aiohttp servers that speak the SGLang shapes.

No model: each ``FakeEngine`` answers from canned handlers and records every call it gets.
Ordering is fixed with events; the only waits are the deadlines under test.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from slime.config import RolloutConfig
from slime.engines.client import EngineClient
from slime.engines.pool import HttpEnginePool
from slime.engines.protocol import SAMPLING_PARAM_KEYS
from slime.errors import EngineRequestError, EngineTimeout, EngineUnavailable, ProtocolError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
FAST = RolloutConfig(request_timeout_s=5.0, control_timeout_s=5.0, max_retries=2, retry_backoff_s=0.01)


def generate_body(rid: str = "r1", ids: tuple[int, ...] = (5, 6)) -> dict[str, Any]:
    return {
        "text": "hi",
        "output_ids": list(ids),
        "meta_info": {
            "id": rid,
            "finish_reason": {"type": "stop", "matched": ids[-1]},
            "prompt_tokens": 3,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": "1",
            "e2e_latency": 0.01,
            "output_token_logprobs": [[-0.5, t, None] for t in ids],
        },
    }


class FakeEngine:
    """Records ``(method, path, json body, content type)`` per call; unknown paths get FastAPI's 404."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, str]] = []
        self.routes: dict[str, Handler] = {}
        self.url = ""

    def on(self, path: str, status: int = 200, body: Any = None, text: str | None = None) -> None:
        async def reply(request: web.Request) -> web.Response:
            if text is not None:
                return web.Response(status=status, text=text)
            return web.json_response(body, status=status)

        self.routes[path] = reply

    def hits(self, path: str) -> int:
        return sum(1 for _, p, _, _ in self.calls if p == path)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.calls.append((request.method, request.path, json.loads(raw) if raw else None, request.content_type))
        handler = self.routes.get(request.path)
        if handler is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        return await handler(request)


@pytest.fixture
async def start_engines():
    servers: list[TestServer] = []

    async def start(n: int = 1) -> list[FakeEngine]:
        engines = []
        for _ in range(n):
            engine = FakeEngine()
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", engine.dispatch)
            server = TestServer(app, host="127.0.0.1")
            await server.start_server()
            servers.append(server)
            engine.url = f"http://127.0.0.1:{server.port}"
            engines.append(engine)
        return engines

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


def dead_url() -> str:
    """A loopback port with nothing listening (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_generate_sends_documented_keys_only_and_parses_the_result(start_engines, session) -> None:
    (engine,) = await start_engines()
    engine.on("/generate", body=generate_body("g0-s0-"))
    client = EngineClient(engine.url, session=session, config=FAST)
    result = await client.generate([1, 2, 3], {"max_new_tokens": 4, "temperature": 1.0}, rid="g0-s0-")
    assert (result.output_ids, result.output_logprobs, result.rid) == ([5, 6], [-0.5, -0.5], "g0-s0-")
    method, _, payload, content_type = engine.calls[0]
    assert (method, content_type) == ("POST", "application/json")
    assert payload["return_logprob"] is True and payload["rid"] == "g0-s0-" and payload["input_ids"] == [1, 2, 3]
    assert set(payload["sampling_params"]) <= SAMPLING_PARAM_KEYS
    assert client.num_inflight == 0


async def test_unknown_sampling_key_or_n_above_one_is_refused_before_sending(start_engines, session) -> None:
    (engine,) = await start_engines()
    client = EngineClient(engine.url, session=session, config=FAST)
    with pytest.raises(ValueError, match="return_logprob"):
        await client.generate([1], {"return_logprob": True})
    with pytest.raises(ValueError, match="n must be 1"):
        await client.generate([1], {"n": 4})
    assert engine.calls == []


async def test_a_052_abort_before_prefill_without_output_ids_parses(start_engines, session) -> None:
    (engine,) = await start_engines()
    engine.on(
        "/generate",
        body={
            "text": "",
            "meta_info": {
                "id": "r",
                "finish_reason": {"type": "abort", "message": "Abort before prefill"},
                "prompt_tokens": 0,
                "completion_tokens": 0,
            },
        },
    )
    result = await EngineClient(engine.url, session=session, config=FAST).generate([1], {}, rid="r")
    assert result.aborted and result.output_ids == [] and result.output_logprobs == []


async def test_a_0517_499_for_a_request_aborted_before_scheduling_is_an_abort_not_an_error(
    start_engines, session
) -> None:
    """Seen on SGLang 0.5.17 (H200): a request held by a pause, then aborted, answers 499."""
    from slime.rollout.generate import generate
    from slime.types import Sample, Status

    (engine,) = await start_engines()
    engine.on("/generate", status=499, body={"error": {"message": "Request held- was aborted"}})
    client = EngineClient(engine.url, session=session, config=FAST)
    result = await client.generate([1], {}, rid="held-")
    assert result.aborted and result.output_ids == [] and result.finish_reason.status_code == 499
    assert result.finish_reason.message == "Request held- was aborted"
    sample = Sample(prompt_ids=[1, 2])
    async with HttpEnginePool([engine.url], config=FAST) as pool:
        await generate(sample, {}, pool=pool, max_response_len=8, engine_version=0)
    assert sample.status is Status.PARTIAL and sample.num_aborts == 1 and not sample.evidence


@pytest.mark.parametrize(
    "status, body, text, error, message",
    [
        (400, {"error": {"message": "Duplicate request ID r"}}, None, EngineRequestError, "Duplicate request ID r"),
        (400, {"error": "unknown field `foo`"}, None, EngineRequestError, "unknown field `foo`"),
        (
            400,
            {"object": "error", "message": "bad body", "type": "Bad Request", "param": None, "code": 400},
            None,
            EngineRequestError,
            "bad body",
        ),
        (
            422,
            {"detail": [{"loc": ["body", "input_ids"], "msg": "field required"}]},
            None,
            EngineRequestError,
            "body.input_ids: field required",
        ),
        (401, {"error": "Unauthorized"}, None, EngineRequestError, "Unauthorized"),
        (
            500,
            {"object": "error", "message": "scheduler died", "type": "500", "param": None, "code": 500},
            None,
            EngineUnavailable,
            "scheduler died",
        ),
        (503, None, "", EngineUnavailable, "(empty body, HTTP 503)"),
        (502, None, "Bad Gateway", EngineUnavailable, "Bad Gateway"),
        (200, None, "<html>not json</html>", ProtocolError, ""),
    ],
)
async def test_generate_maps_each_status_and_body_shape_to_one_error(
    start_engines, session, status, body, text, error, message
) -> None:
    (engine,) = await start_engines()
    engine.on("/generate", status=status, body=body, text=text)
    with pytest.raises(error) as info:
        await EngineClient(engine.url, session=session, config=FAST).generate([1], {})
    exc = info.value
    assert (exc.url, exc.endpoint, exc.status) == (engine.url, "/generate", status)
    assert message in exc.engine_message and f"{engine.url}/generate (HTTP {status})" in str(exc)


async def test_dropped_connection_is_engine_unavailable(session) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        with pytest.raises(EngineUnavailable, match="connection failed"):
            await EngineClient(url, session=session, config=FAST).generate([1], {})
    finally:
        server.close()
        await server.wait_closed()


async def test_slow_generate_raises_engine_timeout_at_the_deadline(start_engines, session) -> None:
    (engine,) = await start_engines()
    release, started = asyncio.Event(), asyncio.Event()

    async def stall(request: web.Request) -> web.Response:
        started.set()
        await release.wait()
        return web.json_response(generate_body())

    engine.routes["/generate"] = stall
    client = EngineClient(engine.url, session=session, config=RolloutConfig(request_timeout_s=0.2))
    task = asyncio.create_task(client.generate([1], {}))
    await started.wait()
    assert client.num_inflight == 1
    t0 = time.monotonic()
    with pytest.raises(EngineTimeout) as info:
        await task
    release.set()
    assert time.monotonic() - t0 < 1.0 and isinstance(info.value, TimeoutError)
    assert client.num_inflight == 0 and "0.2s" in str(info.value)


async def test_connection_refused_gives_up_after_bounded_retries_with_backoff() -> None:
    url = dead_url()
    config = RolloutConfig(max_retries=3, retry_backoff_s=0.02)
    t0 = time.monotonic()
    async with HttpEnginePool([url], config=config) as pool:
        with pytest.raises(EngineUnavailable) as info:
            await pool.generate([1], {})
    elapsed = time.monotonic() - t0
    assert "4 attempts" in str(info.value) and str(info.value).count(url) >= 4
    assert 0.02 * (1 + 2 + 4) <= elapsed < 2.0


async def test_success_false_in_a_200_is_a_request_error(start_engines, session) -> None:
    (engine,) = await start_engines()
    engine.on("/update_weight_version", body={"success": False, "message": "busy"})
    with pytest.raises(EngineRequestError, match="busy"):
        await EngineClient(engine.url, session=session, config=FAST).update_weight_version("4")
    assert engine.calls[0][2] == {"new_version": "4", "abort_all_requests": False}


async def test_control_posts_send_json_bodies(start_engines, session) -> None:
    (engine,) = await start_engines()
    for path in (
        "/pause_generation",
        "/continue_generation",
        "/release_memory_occupation",
        "/resume_memory_occupation",
    ):
        engine.on(path, body=None)
    client = EngineClient(engine.url, session=session, config=FAST)
    await client.pause_generation("retract")
    await client.continue_generation()
    await client.release_memory_occupation(["kv_cache"])
    await client.resume_memory_occupation()
    assert [(c[1], c[2], c[3]) for c in engine.calls] == [
        ("/pause_generation", {"mode": "retract"}, "application/json"),
        ("/continue_generation", {}, "application/json"),
        ("/release_memory_occupation", {"tags": ["kv_cache"]}, "application/json"),
        ("/resume_memory_occupation", {"tags": None}, "application/json"),
    ]
    with pytest.raises(ValueError, match="pause mode"):
        await client.pause_generation("later")  # type: ignore[arg-type]


async def test_flush_cache_is_decided_by_the_status_code_not_the_text(start_engines) -> None:
    idle, busy = await start_engines(2)
    idle.on("/flush_cache", text="Cache flushed.\n")
    busy.on("/flush_cache", status=400, text="Cache flushed.\nPlease check backend logs for more details.")
    async with HttpEnginePool([idle.url, busy.url], config=FAST) as pool:
        assert await pool.flush_cache() == {idle.url: True, busy.url: False}


async def test_model_info_falls_back_to_the_legacy_route_on_404(start_engines, session) -> None:
    (engine,) = await start_engines()
    engine.on("/get_model_info", body={"model_path": "/ckpt/base", "is_generation": True})
    engine.on("/server_info", body={"tp_size": 1, "version": "0.5.23"})
    client = EngineClient(engine.url, session=session, config=FAST)
    assert (await client.model_info())["model_path"] == "/ckpt/base"
    assert (await client.server_info())["version"] == "0.5.23"
    assert [c[1] for c in engine.calls] == ["/model_info", "/get_model_info", "/server_info"]


async def test_wait_ready_polls_health_generate_until_200(start_engines) -> None:
    (engine,) = await start_engines()
    replies = iter([503, 503, 200])

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=next(replies))

    engine.routes["/health_generate"] = health
    async with HttpEnginePool([engine.url], config=FAST) as pool:
        await pool.wait_ready(timeout_s=5.0)
    assert engine.hits("/health_generate") == 3 and engine.hits("/model_info") == 0


async def test_wait_ready_raises_unavailable_or_timeout_after_the_bound(start_engines, session) -> None:
    (engine,) = await start_engines()
    engine.on("/health_generate", status=503, text="")
    t0 = time.monotonic()
    with pytest.raises(EngineTimeout, match="not ready after 0.3s"):
        await EngineClient(engine.url, session=session, config=FAST).wait_ready(0.3)
    with pytest.raises(EngineUnavailable, match="unreachable"):
        await EngineClient(dead_url(), session=session, config=FAST).wait_ready(0.3)
    assert time.monotonic() - t0 < 2.0


async def test_health_generate_is_a_bool_except_for_4xx(start_engines, session) -> None:
    (engine,) = await start_engines()
    engine.on("/health_generate", text="")
    assert await EngineClient(engine.url, session=session, config=FAST).health_generate() is True
    assert await EngineClient(dead_url(), session=session, config=FAST).health_generate() is False
    engine.on("/health_generate", status=401, body={"error": "Unauthorized"})
    with pytest.raises(EngineRequestError, match="Unauthorized"):
        await EngineClient(engine.url, session=session, config=FAST).health_generate()
