"""Launching embedded engines as child processes (the CPU default).

Each engine is ``python -m slime.rollout.engine.server --model DIR --port 0 ...`` in its own
process; it prints ``SLIME_ENGINE_READY url=http://127.0.0.1:PORT`` once it serves. We read that
line (bounded by ``startup_timeout_s``), forward the rest of its output to our log, and terminate
the process on exit. ``restart`` starts the same command again on the port it had, so the engine
keeps its URL (``EngineSupervisor`` relaunches a dead engine this way). Real SGLang servers and the
router are launched by ``slime/rollout/sglang_launch.py``; both kinds share the process interface
(``name``, ``url``, ``pid``, ``returncode``, ``start``, ``restart``, ``stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys

from slime.errors import EngineUnavailable

__all__ = ["EmbeddedEngineProcess", "launch_embedded_engines"]

log = logging.getLogger(__name__)
READY_PREFIX = "SLIME_ENGINE_READY url="


class EmbeddedEngineProcess:
    """One embedded engine child process; ``url`` is set once it is ready."""

    def __init__(self, model_dir: str, *, threads: int = 1, max_running_requests: int = 256, weight_version: str = "0", seed: int = 0):
        self.args = [
            sys.executable, "-m", "slime.rollout.engine.server",
            "--model", model_dir,
            "--host", "127.0.0.1",
            "--port", "0",
            "--threads", str(threads),
            "--max-running-requests", str(max_running_requests),
            "--weight-version", weight_version,
            "--seed", str(seed),
        ]
        self.env = {"OMP_NUM_THREADS": str(threads)}
        """Variables set on top of ours (shown by ``slime train --dry-run``)."""
        self.name = f"embedded-seed{seed}"
        self.proc: asyncio.subprocess.Process | None = None
        self.url: str | None = None
        self._pump: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        """None while running (or never started); the exit code (negative: killed by that signal) after."""
        return self.proc.returncode if self.proc is not None else None

    async def restart(self, startup_timeout_s: float) -> str:
        """Stop the process if it still runs and start the same command on the same port. Returns the url."""
        await self.stop()
        if self.url is not None:
            self.args[self.args.index("--port") + 1] = self.url.rsplit(":", 1)[1]
        return await self.start(startup_timeout_s)

    async def start(self, startup_timeout_s: float) -> str:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.proc = await asyncio.create_subprocess_exec(
            *self.args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
        )
        tail: list[str] = []
        try:
            async with asyncio.timeout(startup_timeout_s):
                while True:
                    raw = await self.proc.stdout.readline()
                    if not raw:
                        rc = await self.proc.wait()
                        raise EngineUnavailable(
                            f"embedded engine exited with code {rc} before it was ready; last output:\n" + "".join(tail[-20:]),
                            endpoint="(launch)",
                        )
                    line = raw.decode(errors="replace")
                    tail.append(line)
                    if line.startswith(READY_PREFIX):
                        self.url = line[len(READY_PREFIX):].strip()
                        break
        except TimeoutError:
            await self.stop()
            raise EngineUnavailable(
                f"embedded engine not ready after {startup_timeout_s}s; last output:\n" + "".join(tail[-20:]), endpoint="(launch)"
            ) from None
        self._pump = asyncio.create_task(self._forward_output(), name=f"engine-log-{self.url}")
        return self.url

    async def _forward_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while raw := await self.proc.stdout.readline():
            log.debug("[engine %s] %s", self.url, raw.decode(errors="replace").rstrip())

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump


@contextlib.asynccontextmanager
async def launch_embedded_engines(model_dir: str, *, num_engines: int, threads: int, max_running_requests: int, startup_timeout_s: float,
                                  seed: int = 0, weight_version: str = "0"):
    """Start ``num_engines`` embedded engines at ``weight_version``; yield their URLs; stop them on exit."""
    procs = [
        EmbeddedEngineProcess(model_dir, threads=threads, max_running_requests=max_running_requests, seed=seed + i, weight_version=weight_version)
        for i in range(num_engines)
    ]
    try:
        urls = await asyncio.gather(*(p.start(startup_timeout_s) for p in procs))
        log.info("embedded engines ready: %s", ", ".join(urls))
        yield list(urls)
    finally:
        await asyncio.gather(*(p.stop() for p in procs), return_exceptions=True)
