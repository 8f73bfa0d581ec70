"""The HTTP glue both servers share (aiohttp): JSON replies, SGLang's error shapes, reading a JSON
body, the ready line, and serving until SIGINT/SIGTERM.

Error shapes (docs/sglang.md#errors): a malformed body or a missing/mistyped field is FastAPI's
``ErrorResponse`` with status 400, ``{"object": "error", "message", "type": "Bad Request", "param":
null, "code": 400}`` (``BadRequest``); an unknown route is 404 ``{"detail": "Not Found"}``; a wrong
method is 405 ``{"detail": "Method Not Allowed"}``. Each server adds its own exceptions to
``error_middleware``.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec
from aiohttp import web

__all__ = [
    "READY_PREFIX",
    "BadRequest",
    "error_middleware",
    "error_response",
    "field",
    "json_response",
    "read_json_object",
    "run_event_loop",
    "serve_until_signal",
]

READY_PREFIX = "SLIME_ENGINE_READY url="
"""The line a server prints on stdout (flushed) once it serves, followed by its URL."""


class BadRequest(Exception):
    """Answered with SGLang's FastAPI ErrorResponse shape (status 400)."""


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type="application/json")


def error_response(message: str, status: int = 400, kind: str = "Bad Request") -> web.Response:
    """FastAPI's ``ErrorResponse`` body with ``status``."""
    return json_response({"object": "error", "message": message, "type": kind, "param": None, "code": status}, status)


def error_middleware(extra: Mapping[type[Exception], Callable[[Any], web.Response]] | None = None) -> Any:
    """An aiohttp middleware answering ``BadRequest``, unknown routes and wrong methods in SGLang's shapes,
    and each exception type of ``extra`` with the reply its function builds."""
    handlers = dict(extra or {})

    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as exc:
            return error_response(str(exc))
        except web.HTTPNotFound:
            return json_response({"detail": "Not Found"}, 404)
        except web.HTTPMethodNotAllowed:
            return json_response({"detail": "Method Not Allowed"}, 405)
        except tuple(handlers) as exc:
            return next(reply for kind, reply in handlers.items() if isinstance(exc, kind))(exc)

    return errors


async def read_json_object(request: web.Request, *, optional: bool = False) -> dict[str, Any]:
    """The request's JSON object body (an empty body is ``{}`` when ``optional``).

    Raises:
        BadRequest: the body is not JSON, or not an object.
    """
    raw = await request.read()
    if not raw.strip() and optional:
        return {}
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"JSON decode error: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"Input should be a valid dictionary or object to extract fields from, got {type(body).__name__}")
    return body


def field(body: dict[str, Any], name: str, kind: type, default: Any = ...) -> Any:
    """``body[name]`` checked against ``kind``; missing/null -> ``default`` (``...`` = required).

    Raises:
        BadRequest: a required field is missing, or a value has the wrong type (a bool is no int).
    """
    value = body.get(name)
    if value is None:
        if default is ...:
            raise BadRequest(f"Field required: body.{name}")
        return default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadRequest(f"Input should be a valid {getattr(kind, '__name__', kind)}: body.{name} = {value!r}")
    return value


async def serve_until_signal(make_server: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
    """Serve ``make_server()`` (an async context manager with a ``url``), print the ready line, and
    return on SIGINT or SIGTERM (leaving the context stops the server)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with make_server() as server:
        print(f"{READY_PREFIX}{server.url}", flush=True)
        await stop.wait()


def run_event_loop(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on uvloop (asyncio's loop if uvloop is missing)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(coro)
        return
    uvloop.run(coro)
