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
from typing import Protocol, TypeVar, overload

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from slime.types import JsonObject

__all__ = [
    "READY_PREFIX",
    "BadRequest",
    "JsonObject",
    "error_middleware",
    "error_response",
    "field",
    "json_response",
    "per_item",
    "read_json_object",
    "run_event_loop",
    "serve_until_signal",
]

READY_PREFIX = "SLIME_ENGINE_READY url="
"""The line a server prints on stdout (flushed) once it serves, followed by its URL."""

_T = TypeVar("_T")
_D = TypeVar("_D")


class BadRequest(Exception):
    """Answered with SGLang's FastAPI ErrorResponse shape (status 400)."""


def json_response(obj: object, status: int = 200) -> web.Response:
    """``obj`` encoded as JSON (msgspec: dicts, lists, scalars, Structs) with ``status``."""
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type="application/json")


def error_response(message: str, status: int = 400, kind: str = "Bad Request") -> web.Response:
    """FastAPI's ``ErrorResponse`` body with ``status``."""
    return json_response({"object": "error", "message": message, "type": kind, "param": None, "code": status}, status)


def error_middleware(extra: Mapping[type[Exception], Callable[[Exception], web.Response]] | None = None) -> Middleware:
    """An aiohttp middleware answering ``BadRequest``, unknown routes and wrong methods in SGLang's shapes,
    and each exception type of ``extra`` with the reply its function builds."""
    handlers = dict(extra or {})

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
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


async def read_json_object(request: web.Request, *, optional: bool = False) -> JsonObject:
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
        raise BadRequest(
            f"Input should be a valid dictionary or object to extract fields from, got {type(body).__name__}"
        )
    return body


@overload
def field(body: JsonObject, name: str, kind: type[_T]) -> _T: ...
@overload
def field(body: JsonObject, name: str, kind: type[_T], default: _D) -> _T | _D: ...
def field(body: JsonObject, name: str, kind: type[_T], default: object = ...) -> object:
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


def per_item(value: _T | list[_T] | None, size: int, name: str, default: _T) -> list[_T]:
    """A body field given once or per batch item, as a list of ``size``: None -> ``default`` each, a
    scalar repeated, a list as is.

    Raises:
        ValueError: a list whose length is not ``size`` (SGLang's words, naming ``name``).
    """
    if value is None:
        return [default] * size
    if not isinstance(value, list):
        return [value] * size
    if len(value) != size:
        raise ValueError(f"The length of {name} ({len(value)}) does not match the batch size ({size}).")
    return value


class _Served(Protocol):
    @property
    def url(self) -> str: ...


async def serve_until_signal(make_server: Callable[[], AbstractAsyncContextManager[_Served]]) -> None:
    """Serve ``make_server()`` (an async context manager with a ``url``), print the ready line, and
    return on SIGINT or SIGTERM (leaving the context stops the server)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with make_server() as server:
        print(f"{READY_PREFIX}{server.url}", flush=True)
        await stop.wait()


def run_event_loop(coro: Coroutine[object, object, None]) -> None:
    """Run ``coro`` on uvloop (asyncio's loop if uvloop is missing)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(coro)
        return
    uvloop.run(coro)
