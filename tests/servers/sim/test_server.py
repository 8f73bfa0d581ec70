"""The simulated engine over HTTP, driven by our own EngineClient / HttpEnginePool (the real client path)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import aiohttp
import pytest

from slime.config import RolloutConfig
from slime.engines.pool import HttpEnginePool
from slime.engines.protocol import parse_generate_response
from slime.errors import EngineRequestError
from slime.rollout.generate import generate
from slime.servers.sim import SimEngine, SimEngineServer
from slime.types import Sample, Status
from tests.servers.sim.helpers import fixed_config, until

CONFIG = RolloutConfig(request_timeout_s=10.0, control_timeout_s=10.0, max_retries=0, retry_backoff_s=0.01)
PROMPT = [11, 12, 13]


@pytest.fixture
async def serve():
    stack: list[SimEngineServer] = []

    async def start(config) -> tuple[SimEngineServer, HttpEnginePool]:
        server = SimEngineServer(config)
        await server.__aenter__()
        stack.append(server)
        pool = HttpEnginePool([server.url], config=CONFIG)
        stack.append(pool)
        return server, pool

    yield start
    for item in reversed(stack):
        await item.close()


async def test_http_results_equal_the_in_process_results(serve):
    config = fixed_config(30)
    server, pool = await serve(config)
    over_http = await pool.generate(PROMPT, {"max_new_tokens": 100, "sampling_seed": 4}, rid="a")
    async with SimEngine(config) as engine:
        in_process = await engine.generate(PROMPT, {"max_new_tokens": 100, "sampling_seed": 4}, "a")
    assert over_http.output_ids == in_process.output_ids and len(over_http.output_ids) == 30
    assert over_http.output_logprobs == in_process.output_logprobs
    assert over_http.token_weight_versions == ["default"] * 30 and over_http.cached_tokens == 0
    assert over_http.prompt_tokens == 3 and over_http.finish_reason.matched == 2 and over_http.rid == "a"


async def test_slimes_generate_function_resumes_a_partial_sample_token_exactly(serve):
    server, pool = await serve(fixed_config(60, max_running_requests=4))
    reference = Sample(prompt_ids=PROMPT, group_id=1, index=0)
    await generate(reference, {}, pool=pool, max_response_len=100, engine_version=0)
    sample = Sample(prompt_ids=PROMPT, group_id=1, index=0)
    task = asyncio.create_task(generate(sample, {}, pool=pool, max_response_len=100, engine_version=0))
    await until(lambda: server.engine.stats().tokens_generated >= 60 + 10)
    await pool.clients[0].abort("slime-g1-s0-a0-r0-")
    await task
    assert sample.status is Status.PARTIAL and 10 <= len(sample.response_ids) < 60
    await pool.update_weights_from_disk("/ckpt/7", weight_version="7")
    await generate(sample, {}, pool=pool, max_response_len=100, engine_version=7)
    assert sample.status is Status.COMPLETED and sample.response_ids == reference.response_ids
    assert sample.rollout_logprobs == reference.rollout_logprobs and sample.num_versions_spanned == 2


async def test_running_and_queued_aborts_return_the_two_protocol_shapes(serve):
    server, pool = await serve(fixed_config(10_000, max_running_requests=1))
    url = server.url
    async with aiohttp.ClientSession() as session:
        posts = [
            asyncio.create_task(
                session.post(
                    f"{url}/generate",
                    json={
                        "input_ids": PROMPT,
                        "sampling_params": {"max_new_tokens": 10_000},
                        "rid": rid,
                        "return_logprob": True,
                    },
                )
            )
            for rid in ("run-", "wait-")
        ]
        await until(lambda: server.engine.num_running == 1 and server.engine.num_waiting == 1)
        await until(lambda: server.engine.stats().tokens_generated >= 3)
        await pool.clients[0].abort(abort_all=True)
        bodies = [await (await post).read() for post in posts]
    running = parse_generate_response(bodies[0], url=url)[0]
    queued = parse_generate_response(bodies[1], url=url)[0]
    assert running.finish_reason.message == "Aborted" and running.finish_reason.status_code is None
    assert len(running.output_ids) >= 3 and running.prompt_tokens == 3
    assert queued.finish_reason.message == "Abort in waiting queue" and queued.output_ids == []
    assert b'"prompt_tokens"' not in bodies[1] and b'"cached_tokens"' not in bodies[1]


async def test_batch_input_ids_answer_an_array_with_expanded_rids(serve):
    server, _ = await serve(fixed_config(5))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{server.url}/generate", json={"input_ids": [[1, 2], [3, 4]], "rid": "b", "return_logprob": [True, False]}
        ) as resp:
            body = await resp.read()
    first, second = parse_generate_response(body, url=server.url, return_logprob=False)
    assert (first.rid, second.rid) == ("b_0", "b_1")
    assert len(first.output_logprobs) == 5 and second.output_logprobs == []


async def test_control_endpoints_through_the_client(serve):
    server, pool = await serve(fixed_config(10_000))
    client = pool.clients[0]
    assert await client.health_generate() and await client.flush_cache()
    task = asyncio.create_task(pool.generate(PROMPT, {"max_new_tokens": 10_000}, rid="long-"))
    await until(lambda: server.engine.stats().tokens_generated >= 5)
    assert not await client.flush_cache()
    await client.pause_generation("in_place")
    assert not await client.health_generate()
    body = await client.update_weights_from_disk("/ckpt/5", weight_version="5")
    assert body["success"] and body["num_paused_requests"] == 1
    info = await client.model_info()
    assert info["weight_version"] == "5" and info["model_path"] == "/ckpt/5"
    assert (await client.server_info())["max_running_requests"] == 256
    await client.continue_generation()
    await client.update_weight_version("6", abort_all_requests=True)
    result = await task
    assert result.finish_reason.type == "abort" and result.token_weight_versions[0] == "default"
    assert {"default", "5"} <= set(result.token_weight_versions)


async def test_sim_stats_endpoint_reports_and_resets_the_counters(serve):
    server, pool = await serve(fixed_config(10, decode_step_per_req_ms=0.0))
    await pool.generate(PROMPT, {"sampling_seed": 1})
    async with aiohttp.ClientSession() as session:
        stats = await (await session.get(f"{server.url}/sim_stats")).json()
        assert stats["num_steps"] == 10 and stats["tokens_generated"] == 10 and stats["requests_finished"] == 1
        assert stats["mean_running_busy"] == pytest.approx(1.0)
        await session.post(f"{server.url}/sim_stats/reset")
        assert (await (await session.get(f"{server.url}/sim_stats")).json())["num_steps"] == 0


async def test_a_client_that_disconnects_aborts_its_request(serve):
    server, _ = await serve(fixed_config(10_000))
    async with aiohttp.ClientSession() as session:
        post = asyncio.create_task(
            session.post(
                f"{server.url}/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 10_000}}
            )
        )
        await until(lambda: server.engine.num_running == 1)
        post.cancel()
        with pytest.raises(asyncio.CancelledError):
            await post
    await until(lambda: server.engine.num_running == 0)
    assert server.engine.stats().requests_aborted == 1


@pytest.mark.parametrize(
    "payload, match",
    [
        ({"input_ids": PROMPT, "sampling_params": {"max_tokens": 3}}, "unknown field `max_tokens`"),
        ({"text": "hi"}, "no tokenizer"),
        ({"input_ids": [1.5]}, "invalid type"),
        ({"input_ids": PROMPT, "stream": True}, "does not stream"),
    ],
)
async def test_bad_generate_requests_are_refused_with_400(serve, payload, match):
    server, pool = await serve(fixed_config(5))
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{server.url}/generate", json=payload) as resp:
            assert resp.status == 400 and match in await resp.text()
    with pytest.raises(EngineRequestError, match="max_new_tokens must be at least 0"):
        await pool.clients[0].generate(PROMPT, {"max_new_tokens": -1})


async def test_the_cli_prints_the_ready_line_and_serves_until_terminated(tmp_path):
    code = "import sys; from slime.servers.sim.server import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--port", "0", "--time-scale", "1000", "--instant"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.startswith("SLIME_ENGINE_READY url=http://127.0.0.1:")
        async with HttpEnginePool([line.split("=", 1)[1].strip()], config=CONFIG) as pool:
            result = await pool.generate(PROMPT, {"max_new_tokens": 4})
        assert len(result.output_ids) == 4
    finally:
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 30) == 0
