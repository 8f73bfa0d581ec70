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

Each group of routes is a class holding the ``ServerState`` (``state.py``) its handlers read:
``GenerateRoutes`` (/generate, /abort_request), ``ControlRoutes`` (pause, continue, disk and version
updates, /flush_cache), ``InfoRoutes`` (health and info); ``add_routes`` registers them all.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import cast

from aiohttp import web

from slime.servers.embedded.model import read_hf_weights
from slime.servers.embedded.parse import ContractError, ParsedGenerate, parse_generate
from slime.servers.embedded.request import EngineRequest, build_response
from slime.servers.embedded.runner import PauseMode
from slime.servers.embedded.state import ServerState, not_ready
from slime.servers.embedded.weights import EngineDied, add_weight_routes, die_if_flush_fails
from slime.servers.http import BadRequest, error_middleware
from slime.servers.http import error_response as _error_response
from slime.servers.http import field as _field
from slime.servers.http import json_response as _json
from slime.servers.http import read_json_object as _body
from slime.types import JsonObject

log = logging.getLogger(__name__)

__all__ = ["add_routes", "ControlRoutes", "ENGINE_VERSION", "GenerateRoutes", "InfoRoutes"]

ENGINE_VERSION = "0.5.23"
"""The SGLang version whose behaviour the engine copies (reported as ``version`` in /server_info)."""

_FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


class GenerateRoutes:
    """``/generate`` (POST and PUT) and ``/abort_request``."""

    def __init__(self, server: ServerState):
        self.server = server

    async def generate(self, request: web.Request) -> web.Response:
        """Parse, run every sample on the runner, answer one object (or an array for batch / n > 1)."""
        body = await _body(request)
        if (refusal := not_ready(self.server)) is not None:
            return refusal
        try:
            parsed = await self._parse(body)
        except ContractError as exc:
            return _json({"error": str(exc)}, 400)
        except ValueError as exc:
            return _json({"error": {"message": str(exc)}}, 400)
        if (dup := self._duplicate_rid(parsed.requests)) is not None:
            return _json({"error": {"message": f"Duplicate request ID {dup} found."}}, 400)
        try:
            await self._run(parsed.requests)
        except RuntimeError as exc:
            return _error_response(f"The engine failed: {exc}", 503, "Service Unavailable")
        return _json(self._reply(parsed))

    async def _parse(self, body: JsonObject) -> ParsedGenerate:
        loaded = self.server.require_loaded()  # set: not_ready() passed
        parse = functools.partial(
            parse_generate,
            body,
            tokenizer=loaded.tokenizer,
            vocab_size=loaded.vocab_size,
            context_length=loaded.context_length,
            seed=self.server.seed,
        )
        if body.get("input_ids") is None and body.get("text") is not None:  # tokenizing: off the event loop
            return await asyncio.to_thread(parse)
        return parse()

    def _duplicate_rid(self, reqs: list[EngineRequest]) -> str | None:
        """The first rid already in flight or repeated within ``reqs``, else None."""
        seen: set[str] = set()
        for req in reqs:
            if req.rid in self.server.inflight or req.rid in seen:
                return req.rid
            seen.add(req.rid)
        return None

    async def _run(self, reqs: list[EngineRequest]) -> None:
        """Submit ``reqs`` and wait until each finished; they count as in flight meanwhile.

        Raises:
            RuntimeError: the runner is stopped or failed.
        """
        runner, rids = self.server.require_runner(), [r.rid for r in reqs]
        self.server.inflight.update((r.rid, r) for r in reqs)
        try:
            runner.submit(reqs)
            await asyncio.gather(*(asyncio.wrap_future(r.done) for r in reqs))
        except asyncio.CancelledError:  # the client went away: stop spending compute on it
            runner.abort(rids=set(rids), message="The client disconnected.")
            raise
        finally:
            for rid in rids:
                self.server.inflight.pop(rid, None)

    def _reply(self, parsed: ParsedGenerate) -> list[JsonObject] | JsonObject:
        loaded, version = self.server.require_loaded(), self.server.require_runner().weight_version
        out = [
            build_response(
                r,
                weight_version=version,
                tokenizer=loaded.tokenizer,
                return_text_in_logprobs=parsed.return_text_in_logprobs,
            )
            for r in parsed.requests
        ]
        return out if parsed.is_batch else out[0]

    async def abort_request(self, request: web.Request) -> web.Response:
        """Abort everything (``abort_all``), or the requests whose rid starts with an in-flight ``rid``."""
        body = await _body(request)
        rid, abort_all = _field(body, "rid", str, ""), _field(body, "abort_all", bool, False)
        runner = self.server.runner
        if runner is not None:
            if abort_all:
                await asyncio.wrap_future(runner.abort())
            elif rid and rid in self.server.inflight:  # exact in-flight match first, then prefix abort (as SGLang)
                await asyncio.wrap_future(runner.abort(rid_prefix=rid))
        return web.Response(status=200)


class ControlRoutes:
    """Pause / continue, the disk and version weight updates, and ``/flush_cache``."""

    def __init__(self, server: ServerState):
        self.server = server

    async def pause_generation(self, request: web.Request) -> web.Response:
        mode = _field(await _body(request), "mode", str, "abort")
        if mode not in ("abort", "retract", "in_place"):
            raise BadRequest(f"Input should be 'abort', 'retract' or 'in_place': body.mode = {mode!r}")
        if (refusal := not_ready(self.server)) is not None:
            return refusal
        await asyncio.wrap_future(
            self.server.require_runner().pause(cast(PauseMode, mode))
        )  # one of them: checked above
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        await _body(request)
        if (refusal := not_ready(self.server)) is not None:
            return refusal
        await asyncio.wrap_future(self.server.require_runner().resume())
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """Read and check an HF directory's safetensors, then load them between decode steps."""
        body = await _body(request)
        model_path = _field(body, "model_path", str)
        version = _field(body, "weight_version", str, None)
        abort_all = _field(body, "abort_all_requests", bool, False)
        load_format = _field(body, "load_format", str, None)
        if (refusal := not_ready(self.server)) is not None:
            return refusal
        if load_format not in (None, "auto", "safetensors"):
            message = (
                f"load_format {load_format!r} is not supported by the slime embedded engine (use auto / safetensors)."
            )
            return _json({"success": False, "message": message, "num_paused_requests": 0}, 400)
        try:
            tensors = await asyncio.to_thread(read_hf_weights, model_path, self.server.require_loaded().model)
        except (ValueError, OSError) as exc:
            return _json({"success": False, "message": str(exc), "num_paused_requests": 0}, 400)
        update = self.server.require_runner().update_weights(tensors, weight_version=version, abort_all=abort_all)
        num_paused = await asyncio.wrap_future(update)
        await die_if_flush_fails(self.server, _field(body, "flush_cache", bool, True), num_paused)
        self.server.model_path = model_path
        message = "Succeeded to update model weights." + (f" Weight version updated to {version}." if version else "")
        return _json({"success": True, "message": message, "num_paused_requests": num_paused})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await _body(request)
        version = _field(body, "new_version", str)
        abort_all = _field(body, "abort_all_requests", bool, True)
        if (refusal := not_ready(self.server)) is not None:
            return refusal
        await asyncio.wrap_future(
            self.server.require_runner().update_weights(None, weight_version=version, abort_all=abort_all)
        )
        return _json({"success": True, "message": f"Weight version updated to {version}", "new_version": version})

    def _busy(self) -> bool:
        return bool(self.server.inflight)  # any /generate between arrival and response (running, queued or held)

    async def flush_cache(self, request: web.Request) -> web.Response:
        """Wait up to ``?timeout=`` seconds for idle; a no-op then (there is no prefix cache), 400 if still busy."""
        try:
            deadline = time.monotonic() + float(request.query.get("timeout", 0))
        except ValueError:
            raise BadRequest(f"Input should be a valid number: query.timeout = {request.query['timeout']!r}") from None
        while self._busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._busy():
            message = "Timed out waiting for idle state." if "timeout" in request.query else "Flush cache failed."
            return web.Response(text=message, status=400)
        return web.Response(text=_FLUSH_OK)


class InfoRoutes:
    """``/health``, ``/health_generate``, ``/ready`` and the model / server info objects."""

    def __init__(self, server: ServerState):
        self.server = server

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if not_ready(self.server) else 200)

    async def health_generate(self, request: web.Request) -> web.Response:
        if not_ready(self.server) or self.server.require_runner().paused:
            return web.Response(status=503)
        return web.Response(status=200 if await self.server.probe() else 503)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if not_ready(self.server) or self.server.require_runner().paused else 200)

    async def model_info(self, request: web.Request) -> web.Response:
        server, loaded = self.server, self.server.loaded
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

    async def server_info(self, request: web.Request) -> web.Response:
        server = self.server
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
                    {
                        "num_running_reqs": runner.num_running if runner else 0,
                        "num_waiting_reqs": runner.num_waiting if runner else 0,
                    }
                ],
            }
        )


def add_routes(app: web.Application, server: ServerState) -> None:
    """Register every route of the engine on ``app``, each handler bound to ``server``."""
    gen, control, info = GenerateRoutes(server), ControlRoutes(server), InfoRoutes(server)
    app.middlewares.append(
        error_middleware({EngineDied: lambda exc: _error_response(str(exc), 500, "Internal Server Error")})
    )
    app.router.add_route("POST", "/generate", gen.generate)
    app.router.add_route("PUT", "/generate", gen.generate)
    for path, handler in [
        ("/abort_request", gen.abort_request),
        ("/pause_generation", control.pause_generation),
        ("/continue_generation", control.continue_generation),
        ("/update_weight_version", control.update_weight_version),
        ("/update_weights_from_disk", control.update_weights_from_disk),
    ]:
        app.router.add_post(path, handler)
    app.router.add_get("/flush_cache", control.flush_cache, allow_head=False)
    app.router.add_post("/flush_cache", control.flush_cache)
    for path, handler in [
        ("/health", info.health),
        ("/health_generate", info.health_generate),
        ("/ready", info.ready),
        ("/model_info", info.model_info),
        ("/get_model_info", info.model_info),
        ("/server_info", info.server_info),
        ("/get_server_info", info.server_info),
    ]:
        app.router.add_get(path, handler)
    add_weight_routes(app, server)
