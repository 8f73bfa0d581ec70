"""``EngineServer``: the embedded engine's HTTP server (aiohttp) and the ``slime engine`` entry point.

Lifecycle: ``start()`` binds the port first (so ``/health*`` answer 503 while the model loads),
loads the model in a worker thread, starts the ``ModelRunner`` thread, runs one 1-token warm-up
generation and only then reports ready. ``close()`` aborts every request (their ``/generate`` calls
complete with ``finish_reason`` abort), stops the runner thread and the HTTP server; it is
idempotent and also runs on ``async with`` exit.

Example::

    async with EngineServer("/ckpt/tiny", port=0) as engine:
        async with aiohttp.ClientSession() as session:
            await session.post(f"{engine.url}/generate", json={"input_ids": [1, 2, 3]})

CLI (``slime engine`` calls ``main``)::

    slime engine --model DIR [--host 127.0.0.1] [--port 0] [--max-running-requests 256] [--threads 1]
                 [--weight-version default] [--seed 0]

prints ``SLIME_ENGINE_READY url=http://127.0.0.1:PORT`` on stdout (flushed) once ready.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import uuid
from pathlib import Path

import torch
from aiohttp import web

from slime.servers.embedded.model import LoadedModel, load_model
from slime.servers.embedded.request import EngineRequest
from slime.servers.embedded.routes import add_routes
from slime.servers.embedded.runner import ModelRunner
from slime.servers.embedded.sampling import SamplingParams, seeded_generator
from slime.servers.http import run_event_loop, serve_until_signal

__all__ = ["EngineServer", "main"]

logger = logging.getLogger(__name__)


class EngineServer:
    """The embedded engine, served on ``host:port`` (port 0 picks a free port; see ``url``).

    It is the ``state.ServerState`` its routes read (``routes.add_routes(app, self)``).

    Args:
        model_path: HF directory of a causal LM (a tokenizer in it is optional).
        host / port: where to listen.
        max_running_requests: rows decoded together; more requests wait in a FIFO queue.
        weight_version: initial ``weight_version``.
        seed: base seed of every request's generator (with the rid; see ``parse.py``).
        num_threads: when given, ``torch.set_num_threads`` (process-wide) before loading.
        warmup: run one 1-token generation before reporting ready.
    """

    loaded: LoadedModel | None
    runner: ModelRunner | None
    inflight: dict[str, EngineRequest]
    """rid -> request, for every ``/generate`` sample between arrival and response."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_running_requests: int = 256,
        weight_version: str = "default",
        seed: int = 0,
        num_threads: int | None = None,
        warmup: bool = True,
    ):
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        self.model_path = str(model_path)
        self.host, self.port = host, port
        self.max_running_requests = max_running_requests
        self.initial_weight_version = weight_version
        self.seed = seed
        self.num_threads = num_threads
        self.warmup = warmup
        self.loaded = None
        self.runner = None
        self.inflight = {}
        self.ready = False
        self.started_s = time.time()
        self._app_runner: web.AppRunner | None = None
        self._closed = False

    @property
    def url(self) -> str:
        """``http://host:port`` with the bound port (valid after ``start``)."""
        if self._app_runner is None:
            raise RuntimeError("EngineServer.url is only known after start()")
        return f"http://{self.host}:{self.port}"

    def require_loaded(self) -> LoadedModel:
        """The loaded model. Raises RuntimeError before ``start()`` has loaded it."""
        if self.loaded is None:
            raise RuntimeError("EngineServer: no model is loaded yet (start() has not finished)")
        return self.loaded

    def require_runner(self) -> ModelRunner:
        """The model runner. Raises RuntimeError before ``start()`` has started it."""
        if self.runner is None:
            raise RuntimeError("EngineServer: the model runner is not started yet (start() has not finished)")
        return self.runner

    @property
    def weight_version(self) -> str:
        return self.runner.weight_version if self.runner is not None else self.initial_weight_version

    async def start(self) -> EngineServer:
        """Bind, load the model, start the runner, warm up; returns once ``/health_generate`` is 200."""
        if self._closed:
            raise RuntimeError("EngineServer cannot be restarted after close()")
        app = web.Application(client_max_size=1 << 30)
        add_routes(app, self)
        self._app_runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._app_runner.setup()
        await web.TCPSite(self._app_runner, self.host, self.port, backlog=4096).start()
        self.port = self._app_runner.addresses[0][1]
        try:
            if self.num_threads is not None:
                torch.set_num_threads(self.num_threads)
            self.loaded = await asyncio.to_thread(load_model, self.model_path)
            self.runner = ModelRunner(
                self.loaded, max_running_requests=self.max_running_requests, weight_version=self.initial_weight_version
            )
            self.runner.start()
            if self.warmup and not await self.probe(timeout_s=120.0):
                raise RuntimeError(f"warm-up generation failed: {self.runner.error!r}")
        except BaseException:
            await self.close()
            raise
        model = self.loaded.model
        logger.info(
            "embedded engine ready at %s: model=%s params=%d context_length=%d vocab=%d eos=%s tokenizer=%s "
            "max_running_requests=%d threads=%d weight_version=%s",
            self.url,
            self.model_path,
            sum(p.numel() for p in model.parameters()),
            self.loaded.context_length,
            self.loaded.vocab_size,
            sorted(self.loaded.eos_token_ids),
            self.loaded.tokenizer is not None,
            self.max_running_requests,
            torch.get_num_threads(),
            self.weight_version,
        )
        self.ready = True
        return self

    async def probe(self, timeout_s: float = 20.0) -> bool:
        """Generate one greedy token from ``input_ids=[0]`` (SGLang's health probe); True on success."""
        if self.runner is None or not self.runner.alive:
            return False
        req = EngineRequest(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            prompt_ids=[0],
            params=SamplingParams(max_new_tokens=1, temperature=0.0),
            generator=seeded_generator(0, "probe"),
        )
        try:
            self.runner.submit([req])
            await asyncio.wait_for(asyncio.wrap_future(req.done), timeout_s)
        except (TimeoutError, RuntimeError):
            self.runner.abort(rids={req.rid})
            return False
        return req.finish_reason is not None and req.finish_reason["type"] != "abort"

    async def close(self) -> None:
        """Abort all requests, stop the runner and the HTTP server. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.ready = False
        if self.runner is not None:
            await asyncio.to_thread(self.runner.stop)
        if self._app_runner is not None:
            await self._app_runner.cleanup()

    async def __aenter__(self) -> EngineServer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slime engine",
        description="The slime embedded engine (SGLang HTTP subset on CPU).",
        epilog="slime engine --sim serves a simulated engine instead: no model, response lengths drawn from a "
        "distribution, for benchmarks (its flags: slime engine --sim --help).",
    )
    p.add_argument("--model", "--model-path", dest="model", required=True, help="HF model directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = pick a free port (printed on the ready line)")
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--weight-version", default="default")
    p.add_argument("--seed", type=int, default=0, help="base seed; each request's generator is seeded from (seed, rid)")
    p.add_argument("--log-level", default="INFO")
    return p


async def _serve(args: argparse.Namespace) -> None:
    await serve_until_signal(
        lambda: EngineServer(
            args.model,
            host=args.host,
            port=args.port,
            max_running_requests=args.max_running_requests,
            weight_version=args.weight_version,
            seed=args.seed,
            num_threads=args.threads,
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Run the engine until SIGINT/SIGTERM. Returns the process exit code (1 if startup failed)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep the child's output line-oriented for the launcher
    try:
        run_event_loop(_serve(args))
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"slime engine: failed to start: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
