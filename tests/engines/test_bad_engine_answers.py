"""Bad engine answers (the bad-input catalogue's engine part, tests/test_bad_input.py has the rest): each
error body shape, an unusable 200 body, a refused connection and a timeout give our error naming the engine
URL and the endpoint, with the engine's own message."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from slime.config import RolloutConfig
from slime.engines.client import EngineClient
from slime.errors import EngineRequestError, EngineTimeout, EngineUnavailable, ProtocolError


def _gen(meta: dict, ids=(5, 6), **kw) -> dict:
    base = {
        "id": "r",
        "finish_reason": {"type": "stop", "matched": 6},
        "output_token_logprobs": [[-0.5, t, None] for t in ids],
    }
    return {"output_ids": list(ids), "meta_info": {**base, **meta}, **kw}


@contextlib.asynccontextmanager
async def engine(status=200, body: object = b"", *, content_type="application/json", hold: asyncio.Event | None = None):
    async def handler(request):
        await request.read()
        if hold is not None:
            await hold.wait()
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return web.Response(status=status, body=data, content_type=content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
        yield EngineClient(
            f"http://127.0.0.1:{server.port}",
            session=session,
            config=RolloutConfig(request_timeout_s=0.3, control_timeout_s=0.3),
        )


ERROR_BODIES = [  # one per documented error-body shape (slime/engines/protocol.py: error_message_from_body)
    ("error string", 400, {"error": "prompt too long"}, "application/json", EngineRequestError, "prompt too long"),
    (
        "error object",
        400,
        {"error": {"message": "bad top_k", "type": "BadRequestError"}},
        "application/json",
        EngineRequestError,
        "bad top_k",
    ),
    (
        "ErrorResponse",
        400,
        {"object": "error", "message": "max_new_tokens too big", "code": 400},
        "application/json",
        EngineRequestError,
        "max_new_tokens too big",
    ),
    (
        "stream error chunk",
        400,
        b'data: {"error": {"message": "stream broke"}}\n\ndata: [DONE]\n',
        "text/event-stream",
        EngineRequestError,
        "stream broke",
    ),
    (
        "FastAPI 422",
        422,
        {"detail": [{"loc": ["body", "input_ids"], "msg": "field required"}]},
        "application/json",
        EngineRequestError,
        "body.input_ids: field required",
    ),
    ("FastAPI 404", 404, {"detail": "Not Found"}, "application/json", EngineRequestError, "Not Found"),
    ("plain text 500", 500, b"Internal Server Error", "text/plain", EngineUnavailable, "Internal Server Error"),
    ("empty 503", 503, b"", "text/plain", EngineUnavailable, "(empty body, HTTP 503)"),
]


@pytest.mark.parametrize(
    "status, body, ctype, cls, message", [e[1:] for e in ERROR_BODIES], ids=[e[0] for e in ERROR_BODIES]
)
async def test_each_error_body_shape_becomes_our_error_with_the_engine_message(status, body, ctype, cls, message):
    async with engine(status, body, content_type=ctype) as client:
        with pytest.raises(cls) as info:
            await client.generate([1, 2], {"max_new_tokens": 4})
    exc = info.value
    assert exc.engine_message == message and exc.status == status and exc.endpoint == "/generate"
    assert str(exc).startswith(f"{client.url}/generate (HTTP {status}): ") and message in str(exc)


async def test_success_false_on_a_control_call_carries_the_engine_message():
    async with engine(200, {"success": False, "message": "weights not found at /w/v3"}) as client:
        with pytest.raises(
            EngineRequestError,
            match=re.escape(f"{client.url}/update_weights_from_disk (HTTP 200): weights not found at /w/v3"),
        ):
            await client.update_weights_from_disk("/w/v3", weight_version="3")


BAD_200 = [
    ("not JSON", b"<html>oops</html>", r"cannot parse /generate response .*<html>oops"),
    (
        "misaligned logprobs",
        _gen({"output_token_logprobs": [[-0.5, 5, None]]}),
        r"len\(output_ids\)=2 != len\(output_token_logprobs\)=1",
    ),
    (
        "unknown finish reason",
        _gen({"finish_reason": {"type": "eos"}}),
        r"cannot parse /generate response .*finish_reason",
    ),
    ("null finish reason", _gen({"finish_reason": None}), r"finish_reason is null"),
    (
        "null logprob",
        _gen({"output_token_logprobs": [[None, 5, None], [-0.5, 6, None]]}),
        r"output_token_logprobs\[0\] has a null logprob",
    ),
    (
        "logprob for another token",
        _gen({"output_token_logprobs": [[-0.5, 9, None], [-0.5, 6, None]]}),
        r"output_token_logprobs\[0\] is for token 9, output_ids\[0\]=5",
    ),
    (
        "weight spans off",
        _gen({"weight_versions": [{"version": "1", "start": 0, "end": 1}]}),
        r"weight_versions spans .* cover 1 of 2 output tokens",
    ),
]


@pytest.mark.parametrize("body, pattern", [b[1:] for b in BAD_200], ids=[b[0] for b in BAD_200])
async def test_a_200_body_we_cannot_use_is_a_protocol_error_naming_the_engine(body, pattern):
    async with engine(200, body) as client:
        with pytest.raises(ProtocolError, match=re.escape(f"{client.url}/generate (HTTP 200): ") + ".*" + pattern):
            await client.generate([1, 2], {"max_new_tokens": 4})


async def test_a_refused_connection_and_a_timeout_name_the_engine_and_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with aiohttp.ClientSession() as session:
        with pytest.raises(EngineUnavailable, match=re.escape(f"{dead}/generate: connection failed")):
            await EngineClient(dead, session=session, config=RolloutConfig()).generate([1], {})
    async with engine(200, _gen({}), hold=(hold := asyncio.Event())) as client:
        with pytest.raises(EngineTimeout, match=re.escape(f"{client.url}/generate: POST timed out after 0.3s")):
            await client.generate([1], {})
        hold.set()
