"""HTTP routes of the embedded engine: SGLang 0.5.23's native subset (docs/sglang.md#stand-in), same shapes.

| route | reply |
| --- | --- |
| POST/PUT /generate | docs/sglang.md#generate-response object, or an array for batch / n > 1 (errors: docs/sglang.md#errors shapes) |
| POST /abort_request | 200, empty body |
| POST /pause_generation, /continue_generation | ``{"message": ..., "status": "ok"}`` |
| POST /update_weights_from_disk | ``{"success", "message", "num_paused_requests"}`` (400 when success is false) |
| POST /update_weight_version | ``{"success", "message", "new_version"}`` |
| GET/POST /flush_cache | plain text; 400 ``Flush cache failed.`` while requests are in flight |
| GET /health, /health_generate, /ready | 200 / 503, empty body |
| GET /model_info, /get_model_info, /server_info, /get_server_info | JSON objects (docs/sglang.md#model-info, a subset) |
| weight sessions, process groups, tensor / distributed / delta updates, memory release / resume | see ``weights.py`` |

Error bodies (docs/sglang.md#errors): unreadable or non-object JSON and missing required fields ->
``{"object": "error", "message", "type": "Bad Request", "param": null, "code": 400}``; unknown
route -> 404 ``{"detail": "Not Found"}``; wrong method -> 405 ``{"detail": "Method Not Allowed"}``.
``/health`` answers without a probe (like ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false``);
``/health_generate`` runs a 1-token probe, and answers 503 at once while paused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import web

from slime.servers.embedded.model import read_hf_weights
from slime.servers.embedded.parse import ContractError, parse_generate
from slime.servers.embedded.request import build_response
from slime.servers.embedded.weights import EngineDied, add_weight_routes, die_if_flush_fails
from slime.servers.http import BadRequest, error_middleware
from slime.servers.http import error_response as _error_response
from slime.servers.http import field as _field
from slime.servers.http import json_response as _json
from slime.servers.http import read_json_object as _body

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from slime.servers.embedded.server import EngineServer

__all__ = ["add_routes", "ENGINE_VERSION"]

ENGINE_VERSION = "0.5.23"
"""The SGLang version whose behaviour the engine copies (reported as ``version`` in /server_info)."""

_FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


def add_routes(app: web.Application, server: EngineServer) -> None:
    """Register every route on ``app``, bound to ``server``'s runner and state."""

    def not_ready() -> web.Response | None:
        if server.ready and server.runner is not None and server.runner.alive:
            return None
        return _error_response("The server is not ready.", 503, "Service Unavailable")

    async def generate(request: web.Request) -> web.Response:
        body = await _body(request)
        if (refusal := not_ready()) is not None:
            return refusal
        loaded, runner = server.require_loaded(), server.require_runner()  # set: not_ready() passed
        kwargs = dict(tokenizer=loaded.tokenizer, vocab_size=loaded.vocab_size, context_length=loaded.context_length, seed=server.seed)
        try:
            if body.get("input_ids") is None and body.get("text") is not None:  # tokenizing: off the event loop
                parsed = await asyncio.to_thread(parse_generate, body, **kwargs)
            else:
                parsed = parse_generate(body, **kwargs)
        except ContractError as exc:
            return _json({"error": str(exc)}, 400)
        except ValueError as exc:
            return _json({"error": {"message": str(exc)}}, 400)
        reqs = parsed.requests
        rids = [r.rid for r in reqs]
        seen: set[str] = set()
        dup = next((rid for rid in rids if rid in server.inflight or rid in seen or seen.add(rid)), None)  # type: ignore[func-returns-value]  # add() records it; None keeps the scan going
        if dup is not None:
            return _json({"error": {"message": f"Duplicate request ID {dup} found."}}, 400)
        server.inflight.update((r.rid, r) for r in reqs)
        try:
            runner.submit(reqs)
            await asyncio.gather(*(asyncio.wrap_future(r.done) for r in reqs))
        except asyncio.CancelledError:  # the client went away: stop spending compute on it
            runner.abort(rids=set(rids), message="The client disconnected.")
            raise
        except RuntimeError as exc:
            return _error_response(f"The engine failed: {exc}", 503, "Service Unavailable")
        finally:
            for rid in rids:
                server.inflight.pop(rid, None)
        out = [
            build_response(
                r, weight_version=runner.weight_version, tokenizer=loaded.tokenizer, return_text_in_logprobs=parsed.return_text_in_logprobs
            )
            for r in reqs
        ]
        return _json(out if parsed.is_batch else out[0])

    async def abort_request(request: web.Request) -> web.Response:
        body = await _body(request)
        rid, abort_all = _field(body, "rid", str, ""), _field(body, "abort_all", bool, False)
        if server.runner is not None:
            if abort_all:
                await asyncio.wrap_future(server.runner.abort())
            elif rid and rid in server.inflight:  # exact in-flight match first, then prefix abort (as SGLang)
                await asyncio.wrap_future(server.runner.abort(rid_prefix=rid))
        return web.Response(status=200)

    async def pause_generation(request: web.Request) -> web.Response:
        mode = _field(await _body(request), "mode", str, "abort")
        if mode not in ("abort", "retract", "in_place"):
            raise BadRequest(f"Input should be 'abort', 'retract' or 'in_place': body.mode = {mode!r}")
        if (refusal := not_ready()) is not None:
            return refusal
        await asyncio.wrap_future(server.require_runner().pause(mode))
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(request: web.Request) -> web.Response:
        await _body(request)
        if (refusal := not_ready()) is not None:
            return refusal
        await asyncio.wrap_future(server.require_runner().resume())
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weights_from_disk(request: web.Request) -> web.Response:
        body = await _body(request)
        model_path = _field(body, "model_path", str)
        version = _field(body, "weight_version", str, None)
        abort_all = _field(body, "abort_all_requests", bool, False)
        load_format = _field(body, "load_format", str, None)
        if (refusal := not_ready()) is not None:
            return refusal
        if load_format not in (None, "auto", "safetensors"):
            return _json(
                {
                    "success": False,
                    "message": f"load_format {load_format!r} is not supported by the slime embedded engine (use auto / safetensors).",
                    "num_paused_requests": 0,
                },
                400,
            )
        try:
            tensors = await asyncio.to_thread(read_hf_weights, model_path, server.require_loaded().model)
        except (ValueError, OSError) as exc:
            return _json({"success": False, "message": str(exc), "num_paused_requests": 0}, 400)
        update = server.require_runner().update_weights(tensors, weight_version=version, abort_all=abort_all)
        num_paused = await asyncio.wrap_future(update)
        await die_if_flush_fails(server, _field(body, "flush_cache", bool, True), num_paused)
        server.model_path = model_path
        message = "Succeeded to update model weights." + (f" Weight version updated to {version}." if version else "")
        return _json({"success": True, "message": message, "num_paused_requests": num_paused})

    async def update_weight_version(request: web.Request) -> web.Response:
        body = await _body(request)
        version = _field(body, "new_version", str)
        abort_all = _field(body, "abort_all_requests", bool, True)
        if (refusal := not_ready()) is not None:
            return refusal
        await asyncio.wrap_future(server.require_runner().update_weights(None, weight_version=version, abort_all=abort_all))
        return _json({"success": True, "message": f"Weight version updated to {version}", "new_version": version})

    def busy() -> bool:  # any /generate between arrival and response (running, queued or held)
        return bool(server.inflight)

    async def flush_cache(request: web.Request) -> web.Response:
        try:
            deadline = time.monotonic() + float(request.query.get("timeout", 0))
        except ValueError:
            raise BadRequest(f"Input should be a valid number: query.timeout = {request.query['timeout']!r}") from None
        while busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if busy():
            message = "Timed out waiting for idle state." if "timeout" in request.query else "Flush cache failed."
            return web.Response(text=message, status=400)
        return web.Response(text=_FLUSH_OK)  # no prefix cache to flush: always a no-op

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=503 if not_ready() else 200)

    async def health_generate(request: web.Request) -> web.Response:
        if not_ready() or server.require_runner().paused:
            return web.Response(status=503)
        return web.Response(status=200 if await server.probe() else 503)

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=503 if not_ready() or server.require_runner().paused else 200)

    async def model_info(request: web.Request) -> web.Response:
        loaded = server.loaded
        has_tok = loaded is not None and loaded.tokenizer is not None
        return _json(
            {
                "model_path": server.model_path,
                "served_model_name": server.model_path,
                "tokenizer_path": server.model_path if has_tok else None,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": server.weight_version,
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": loaded.model_type if loaded else None,
                "architectures": loaded.architectures if loaded else None,
            }
        )

    async def server_info(request: web.Request) -> web.Response:
        loaded, runner = server.require_loaded(), server.require_runner()  # set: not_ready() passed
        context_length = loaded.context_length if loaded else None
        return _json(
            {
                "model_path": server.model_path,
                "tokenizer_path": server.model_path,
                "host": server.host,
                "port": server.port,
                "tp_size": 1,
                "dp_size": 1,
                "pp_size": 1,
                "version": ENGINE_VERSION,
                "engine": "slime-embedded",
                "context_length": context_length,
                "max_req_input_len": (context_length - 1) if context_length else None,
                "max_total_num_tokens": server.max_running_requests * context_length if context_length else None,
                "max_running_requests": server.max_running_requests,
                "random_seed": server.seed,
                "skip_tokenizer_init": loaded is None or loaded.tokenizer is None,
                "weight_version": server.weight_version,
                "status": "Up" if server.ready else "Starting",
                "startup_time": server.started_s,
                "internal_states": [
                    {"num_running_reqs": runner.num_running if runner else 0, "num_waiting_reqs": runner.num_waiting if runner else 0}
                ],
            }
        )

    app.middlewares.append(error_middleware({EngineDied: lambda exc: _error_response(str(exc), 500, "Internal Server Error")}))
    app.router.add_route("POST", "/generate", generate)
    app.router.add_route("PUT", "/generate", generate)
    for path, handler in [
        ("/abort_request", abort_request),
        ("/pause_generation", pause_generation),
        ("/continue_generation", continue_generation),
        ("/update_weight_version", update_weight_version),
        ("/update_weights_from_disk", update_weights_from_disk),
    ]:
        app.router.add_post(path, handler)
    app.router.add_get("/flush_cache", flush_cache, allow_head=False)
    app.router.add_post("/flush_cache", flush_cache)
    for path, handler in [
        ("/health", health),
        ("/health_generate", health_generate),
        ("/ready", ready),
        ("/model_info", model_info),
        ("/get_model_info", model_info),
        ("/server_info", server_info),
        ("/get_server_info", server_info),
    ]:
        app.router.add_get(path, handler)
    add_weight_routes(app, server)
