"""``ServerState``: what the embedded engine's route classes read from the server (a Protocol).

The routes (``routes.py``, ``weights.py``) are typed against this, not against ``EngineServer``, so
``server.py`` imports the routes and nothing imports ``server.py`` back. ``EngineServer`` is the
one implementation.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from slime.servers.embedded.model import LoadedModel
from slime.servers.embedded.request import EngineRequest
from slime.servers.embedded.runner import ModelRunner
from slime.servers.http import error_response

__all__ = ["ServerState", "not_ready"]


class ServerState(Protocol):
    """The serving state of one embedded engine, as its HTTP handlers see it.

    ``loaded`` and ``runner`` are None until ``start()`` has loaded the model and started the runner;
    ``require_loaded`` / ``require_runner`` return them or raise RuntimeError.
    """

    model_path: str
    """The HF directory served (``/update_weights_from_disk`` sets it to the directory it loaded)."""
    host: str
    port: int
    seed: int
    max_running_requests: int
    started_s: float
    """``time.time()`` when the server was built (``/server_info``'s ``startup_time``)."""
    ready: bool
    loaded: LoadedModel | None
    runner: ModelRunner | None
    inflight: dict[str, EngineRequest]
    """rid -> request, for every ``/generate`` sample between arrival and response."""

    @property
    def weight_version(self) -> str: ...

    def require_loaded(self) -> LoadedModel: ...

    def require_runner(self) -> ModelRunner: ...

    async def probe(self, timeout_s: float = 20.0) -> bool: ...


def not_ready(server: ServerState) -> web.Response | None:
    """None when ``server`` serves (ready, runner thread alive); else the 503 ErrorResponse to answer."""
    if server.ready and server.runner is not None and server.runner.alive:
        return None
    return error_response("The server is not ready.", 503, "Service Unavailable")
