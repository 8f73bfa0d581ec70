"""SGLang 0.5.23 weight-update sessions: the embedded engine's rules and how the sync side copes."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from aiohttp import web

from slime.config import RolloutConfig
from slime.engines.client import EngineClient
from slime.errors import EngineRequestError
from slime.sync.base import SESSION_HINT, weight_update_session
from slime.sync.wire import serialize_safetensors


async def test_a_second_begin_fails_and_end_needs_a_begin(pool):
    client = pool.clients[0]
    with pytest.raises(EngineRequestError) as exc:
        await client.end_weight_update()
    assert exc.value.status == 400 and "without begin_weight_update" in exc.value.engine_message
    assert await client.begin_weight_update() is True
    with pytest.raises(EngineRequestError) as exc:
        await client.begin_weight_update()
    assert exc.value.status == 400
    assert await client.end_weight_update() is True


@pytest.mark.parametrize("endpoint", ["tensor", "distributed", "delta"])
async def test_updates_outside_a_session_get_sglangs_400(pool, engine, v2_state, endpoint):
    client = pool.clients[0]
    with pytest.raises(EngineRequestError) as exc:
        if endpoint == "tensor":
            await client.update_weights_from_tensor([serialize_safetensors(list(v2_state.items()))], weight_version="1")
        elif endpoint == "distributed":
            await client.update_weights_from_distributed(
                ["lm_head.weight"], ["float32"], [[64, 32]], group_name="g", weight_version="1"
            )
        else:
            from slime.sync.codec import encode_payload, encode_tensor

            payload = encode_payload(
                [encode_tensor("lm_head.weight", None, v2_state["lm_head.weight"])], {"weight_version": "1"}
            )
            await client.update_weights_from_delta(payload)
    assert exc.value.status == 400 and SESSION_HINT in exc.value.engine_message
    assert engine.weight_version == "0"


async def test_the_session_helper_ends_a_session_a_crashed_trainer_left_open(pool, caplog):
    client = pool.clients[0]
    await client.begin_weight_update()  # the crashed trainer's
    with caplog.at_level(logging.WARNING, logger="slime.sync.base"):
        async with weight_update_session(pool.clients) as opened:
            assert opened == {client.url: True}
    assert "already open" in caplog.text
    assert await client.begin_weight_update() is True  # the helper's own session was ended
    await client.end_weight_update()


async def test_an_engine_without_sessions_404_is_used_without_one():
    """SGLang 0.5.6 has no /begin_weight_update: begin answers False and no end is sent."""
    calls = []

    async def record(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.json_response({"detail": "Not Found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with aiohttp.ClientSession() as session:
            client = EngineClient(f"http://127.0.0.1:{runner.addresses[0][1]}", session=session, config=RolloutConfig())
            async with weight_update_session([client]) as opened:
                assert opened == {client.url: False}
    finally:
        await runner.cleanup()
    assert calls == ["/begin_weight_update"]
