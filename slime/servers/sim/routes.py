"""HTTP routes of the simulated engine: the SGLang native subset (docs/sglang.md), same shapes.

| route | reply |
| --- | --- |
| POST/PUT /generate | docs/sglang.md#generate-response object (docs/sglang.md#abort, case B for a queued abort), an array for a batch; ``input_ids`` only, no ``text`` |
| POST /abort_request | 200, empty body (docs/sglang.md#abort) |
| POST /pause_generation, /continue_generation | ``{"message": ..., "status": "ok"}`` (docs/sglang.md#pause) |
| POST /update_weights_from_disk | ``{"success", "message", "num_paused_requests"}`` (docs/sglang.md#update-weights-from-disk; nothing is read) |
| POST /update_weight_version | ``{"success", "message", "new_version"}`` (docs/sglang.md#weight-version) |
| GET/POST /flush_cache | plain text; 400 ``Flush cache failed.`` while requests are in flight (docs/sglang.md#flush-cache) |
| GET /health, /health_generate | 200, empty; ``/health_generate`` 503 at once while paused (docs/sglang.md#health) |
| GET /model_info, /get_model_info, /server_info, /get_server_info | JSON objects (docs/sglang.md#model-info, a subset) |
| GET /sim_stats, POST /sim_stats/reset | ``SimStats`` (``stats.py``); ``{"success": true}`` |

Error shapes (docs/sglang.md#errors): contract violations ``{"error": "<str>"}``, bad values ``{"error": {"message"}}``,
malformed bodies the FastAPI ``ErrorResponse``, unknown routes ``{"detail": "Not Found"}`` (404),
wrong methods ``{"detail": "Method Not Allowed"}`` (405). Responses omit ``text`` (as SGLang with
``--skip-tokenizer-init``). A client that disconnects aborts its requests (the app must be served
with ``handler_cancellation=True``, as ``SimEngineServer`` does).
"""

from __future__ import annotations

import asyncio
import itertools
import time

import msgspec
from aiohttp import web

from slime.engines.protocol import SAMPLING_PARAM_KEYS
from slime.servers.http import BadRequest as _BadRequest
from slime.servers.http import error_middleware, per_item
from slime.servers.http import json_response as _json
from slime.servers.http import read_json_object as _body
from slime.servers.sim.engine import SimEngine, SimOutput
from slime.types import JsonObject

__all__ = ["build_app", "to_wire"]

_ENGINE_KEY = web.AppKey("sim_engine", SimEngine)


class _Refused(Exception):
    """Answered with ``{"error": <payload>}``, 400: a string for contract violations, else ``{"message"}``."""


def to_wire(out: SimOutput) -> JsonObject:
    """The docs/sglang.md#generate-response response object (the smaller docs/sglang.md#abort, case B layout for a queued abort)."""
    ids, lps = out.tokens()
    meta: JsonObject = {"id": out.rid, "finish_reason": out.finish_reason}
    if not out.queued_abort:
        meta["prompt_tokens"] = out.prompt_tokens
    meta["completion_tokens"] = out.num_tokens
    if not out.queued_abort:
        meta.update(cached_tokens=0, reasoning_tokens=0, num_retractions=out.num_retractions)
    meta["weight_version"] = out.spans[-1][0]
    meta["weight_versions"] = [{"version": v, "start": s, "end": e} for v, s, e in out.spans]
    meta["e2e_latency"] = out.e2e_latency
    if out.return_logprob:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = list(zip(lps, ids, itertools.repeat(None)))
        meta["output_token_logprobs_length"] = out.num_tokens
    meta["response_sent_to_client_ts"] = time.time()
    return {"output_ids": ids, "meta_info": meta}


def _check_generate(body: JsonObject) -> tuple[bool, list[list[int]], list[JsonObject]]:
    """(is_batch, prompts, per-prompt sampling params); raises ``_Refused`` with SGLang's words."""
    if body.get("stream"):
        raise _Refused({"message": 'The slime sim engine does not stream; send "stream": false.'})
    input_ids = body.get("input_ids")
    if input_ids is None:
        has_text = body.get("text") is not None
        raise _Refused(
            {
                "message": "The slime sim engine has no tokenizer; send input_ids."
                if has_text
                else "Either text, input_ids or input_embeds should be provided."
            }
        )
    is_batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
    prompts = input_ids if is_batch else [input_ids]
    for prompt in prompts:
        if not isinstance(prompt, list) or not all(type(t) is int for t in prompt):
            raise _Refused("invalid type: expected a sequence of i64 token ids")
    raw_sp = body.get("sampling_params") or {}
    sp_list = raw_sp if isinstance(raw_sp, list) else [raw_sp] * len(prompts)
    for sp in sp_list:
        if not isinstance(sp, dict):
            raise _Refused("invalid type: expected struct SamplingParams")
        unknown = sorted(set(sp) - SAMPLING_PARAM_KEYS)
        if unknown:
            raise _Refused(
                f"unknown field `{unknown[0]}`, expected one of "
                + ", ".join(f"`{k}`" for k in sorted(SAMPLING_PARAM_KEYS))
            )
    if len(sp_list) != len(prompts):
        raise _Refused(
            {
                "message": f"The length of sampling_params ({len(sp_list)}) does not match the batch size ({len(prompts)})."
            }
        )
    return is_batch, prompts, sp_list


async def _generate(request: web.Request) -> web.Response:
    engine = request.app[_ENGINE_KEY]
    body = await _body(request)
    is_batch, prompts, sp_list = _check_generate(body)
    futures: list[asyncio.Future] = []
    try:
        rid = body.get("rid")
        rids = (
            per_item(rid, len(prompts), "rid", None)
            if isinstance(rid, list) or rid is None
            else [f"{rid}_{i}" for i in range(len(prompts))]
            if is_batch
            else [rid]
        )
        logprob = per_item(body.get("return_logprob"), len(prompts), "return_logprob", False)
        for prompt, sp, item_rid, want_lp in zip(prompts, sp_list, rids, logprob):
            futures.append(engine.submit(prompt, sp, item_rid, return_logprob=bool(want_lp)))
    except (ValueError, TypeError) as exc:
        engine.drop(futures)
        raise _Refused({"message": str(exc)}) from None
    try:
        outs = await asyncio.gather(*futures)
    except asyncio.CancelledError:  # the client went away (handler_cancellation): abort its requests
        engine.drop(futures)
        raise
    items = [to_wire(out) for out in outs]
    return _json(items if is_batch else items[0])


async def _abort_request(request: web.Request) -> web.Response:
    body = await _body(request)
    request.app[_ENGINE_KEY].abort(str(body.get("rid") or ""), abort_all=bool(body.get("abort_all", False)))
    return web.Response(status=200)


async def _pause(request: web.Request) -> web.Response:
    mode = (await _body(request)).get("mode", "abort")
    try:
        request.app[_ENGINE_KEY].pause_generation(mode)
    except ValueError as exc:
        raise _BadRequest(str(exc)) from None
    return _json({"message": "Generation paused successfully.", "status": "ok"})


async def _continue(request: web.Request) -> web.Response:
    await _body(request)
    request.app[_ENGINE_KEY].continue_generation()
    return _json({"message": "Generation continued successfully.", "status": "ok"})


def _required_str(body: JsonObject, key: str) -> str:
    if not isinstance(body.get(key), str):
        raise _BadRequest(f"{key}: Field required (a string)")
    return body[key]


async def _update_weights_from_disk(request: web.Request) -> web.Response:
    body = await _body(request)
    return _json(
        await request.app[_ENGINE_KEY].update_weights_from_disk(
            _required_str(body, "model_path"),
            weight_version=body.get("weight_version"),
            abort_all_requests=bool(body.get("abort_all_requests", False)),
        )
    )


async def _update_weight_version(request: web.Request) -> web.Response:
    body = await _body(request)  # SGLang's default for abort_all_requests is true here (docs/sglang.md#weight-version)
    return _json(
        request.app[_ENGINE_KEY].update_weight_version(
            _required_str(body, "new_version"), abort_all_requests=bool(body.get("abort_all_requests", True))
        )
    )


async def _flush_cache(request: web.Request) -> web.Response:
    if request.app[_ENGINE_KEY].flush_cache():
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are running "
            "or waiting requests, the operation will not be performed.)\n"
        )
    return web.Response(status=400, text="Flush cache failed.")


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _health_generate(request: web.Request) -> web.Response:
    return web.Response(status=503 if request.app[_ENGINE_KEY].paused else 200)


async def _model_info(request: web.Request) -> web.Response:
    engine = request.app[_ENGINE_KEY]
    return _json(
        {
            "model_path": engine.model_path,
            "served_model_name": engine.model_path,
            "tokenizer_path": None,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": engine.weight_version,
            "model_type": "slime-sim",
            "architectures": ["SlimeSim"],
        }
    )


async def _server_info(request: web.Request) -> web.Response:
    engine = request.app[_ENGINE_KEY]
    info = msgspec.structs.asdict(engine.config)
    info.update(
        model_path=engine.model_path,
        weight_version=engine.weight_version,
        version="slime-sim",
        status="paused" if engine.paused else "ok",
        internal_states=[{"num_running": engine.num_running, "num_waiting": engine.num_waiting}],
    )
    return _json(info)


async def _sim_stats(request: web.Request) -> web.Response:
    return _json(request.app[_ENGINE_KEY].stats())


async def _sim_stats_reset(request: web.Request) -> web.Response:
    request.app[_ENGINE_KEY].reset_stats()
    return _json({"success": True})


def build_app(engine: SimEngine) -> web.Application:
    """An aiohttp app serving ``engine`` (whose lifecycle the caller owns)."""
    app = web.Application(
        client_max_size=1 << 30,
        middlewares=[error_middleware({_Refused: lambda exc: _json({"error": exc.args[0]}, 400)})],
    )
    app[_ENGINE_KEY] = engine
    for method in ("POST", "PUT"):
        app.router.add_route(method, "/generate", _generate)
    for path, handler in (
        ("/abort_request", _abort_request),
        ("/pause_generation", _pause),
        ("/continue_generation", _continue),
        ("/update_weights_from_disk", _update_weights_from_disk),
        ("/update_weight_version", _update_weight_version),
        ("/sim_stats/reset", _sim_stats_reset),
    ):
        app.router.add_post(path, handler)
    for path, handler in (
        ("/health", _health),
        ("/health_generate", _health_generate),
        ("/model_info", _model_info),
        ("/get_model_info", _model_info),
        ("/server_info", _server_info),
        ("/get_server_info", _server_info),
        ("/sim_stats", _sim_stats),
        ("/flush_cache", _flush_cache),
    ):
        app.router.add_get(path, handler)
    app.router.add_post("/flush_cache", _flush_cache)
    return app
