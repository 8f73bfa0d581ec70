"""``SimEngineServer`` (the simulated engine on a loopback port) and ``slime engine --sim`` (``main``).

Example::

    async with SimEngineServer(SimConfig(time_scale=3)) as server:
        async with HttpEnginePool([server.url], config=RolloutConfig()) as pool:
            result = await pool.generate([1, 2, 3], {"max_new_tokens": 512, "sampling_seed": 7})
        server.engine.stats().slot_utilization

CLI: ``slime engine --sim [--host 127.0.0.1] [--port 30000] [flags of config.FLAGS]`` serves until
SIGINT/SIGTERM and prints ``SLIME_ENGINE_READY url=http://HOST:PORT`` (flushed) once serving.
Routes: ``routes.py``.
"""

from __future__ import annotations

import argparse
import sys

from aiohttp import web

from slime.errors import ConfigError
from slime.servers.http import run_event_loop, serve_until_signal
from slime.servers.sim.config import SimConfig, add_sim_flags, config_from_args
from slime.servers.sim.engine import SimEngine
from slime.servers.sim.lengths import make_length_distribution
from slime.servers.sim.routes import build_app

__all__ = ["SimEngineServer", "build_parser", "main"]

BACKLOG = 4096
"""Listen backlog (capped by the kernel's somaxconn): the benchmark opens hundreds of connections at
once, and aiohttp's default of 128 makes the overflow wait for a 1 s SYN retransmit."""


class SimEngineServer:
    """``async with SimEngineServer(config) as server``: a ``SimEngine`` served on ``server.url``.

    ``port=0`` picks a free port. ``server.engine`` is the simulation core (counters, control).
    """

    def __init__(self, config: SimConfig, host: str = "127.0.0.1", port: int = 0):
        self.config = config
        self.host = host
        self.port = port
        self.url = ""
        self.engine: SimEngine | None = None
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> SimEngineServer:
        self.engine = SimEngine(self.config)
        self.engine.start()
        self._runner = web.AppRunner(
            build_app(self.engine),
            handler_cancellation=True,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=5.0,
        )
        try:
            await self._runner.setup()
            await web.TCPSite(self._runner, self.host, self.port, backlog=BACKLOG).start()
        except BaseException:
            await self.close()
            raise
        self.port = self._runner.addresses[0][1]
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        self.url = f"http://{shown}:{self.port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Abort in-flight requests (they get their abort responses), then stop serving. Idempotent."""
        if self.engine is not None:
            await self.engine.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slime engine --sim", description="Serve the simulated SGLang engine (no model)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    parser.add_argument("--sim", action="store_true", help=argparse.SUPPRESS)  # tolerated if passed through
    return add_sim_flags(parser)


async def _serve(config: SimConfig, host: str, port: int) -> None:
    await serve_until_signal(lambda: SimEngineServer(config, host, port))


def main(argv: list[str] | None = None) -> int:
    """``slime engine --sim [flags]``: serve until SIGINT/SIGTERM; prints ``SLIME_ENGINE_READY url=...``.

    Returns 0 on a clean stop, 2 on a bad flag value.
    """
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = config_from_args(ns)
        make_length_distribution(config)  # read a histogram file now, to fail before serving
    except ConfigError as exc:
        print(f"slime engine --sim: error: {exc}", file=sys.stderr)
        return 2
    try:
        run_event_loop(_serve(config, ns.host, ns.port))
    except OSError as exc:  # the port is taken, the host cannot be bound
        print(f"slime engine --sim: error: cannot serve on {ns.host}:{ns.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
