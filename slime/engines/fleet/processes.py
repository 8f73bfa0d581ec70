"""One engine process each: ``CommandProcess`` (an SGLang server or router of a ``LaunchPlan``) and
``EmbeddedEngineProcess`` (an embedded engine, the CPU default). Both have the process interface
``EngineSupervisor`` uses (``name``, ``url``, ``pid``, ``returncode``, ``start``/``ready``, ``restart``,
``stop``); ``restart`` runs the same command again on the same port, so the engine keeps its URL.

``CommandProcess``: each runs in its own session (process group), so ``stop`` ends the whole tree SGLang spawns
(scheduler and detokenizer processes): SIGTERM to the group, SIGKILL after ``grace_s``. Output goes
to ``log_path`` (appended across restarts), else to ours. Readiness is the ``ready(timeout_s)``
coroutine (``EngineClient.wait_ready``: ``/health_generate`` 200; ``RouterClient.wait_ready``),
raced against the process exiting, so a server that dies while loading fails at once. ``restart``
runs the same command again (same port, same GPUs).

The child's environment is ours (``PYTHONPATH``, ``CUDA_HOME``, ``NCCL_*``, ...) with ``env`` on top,
minus the torchrun variables of the trainer's process group (``TORCHRUN_VARS``: ``RANK``,
``MASTER_PORT``, ...; the megatron trainer sets them even without torchrun), which are not the
server's: SGLang sets up its own TP group.

Every process (``CommandProcess`` and ``EmbeddedEngineProcess``) is started through
``slime.engines.fleet.lifeline``: the kernel kills it when this process dies, ``kill -9`` included
(a parent-death signal; SGLang's own children watch their parent the same way); our group kill covers
normal exits. Not covered: a tree whose members left the process group and do not watch their parent.

``EmbeddedEngineProcess``: ``python -m slime.servers.embedded.server --model DIR --port 0 ...``; it
prints ``SLIME_ENGINE_READY url=http://127.0.0.1:PORT`` once it serves. We read that line (bounded by
``startup_timeout_s``), forward the rest of its output to our log, and terminate the process on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from slime.engines.fleet.lifeline import with_lifeline
from slime.errors import EngineUnavailable

__all__ = ["CommandProcess", "EmbeddedEngineProcess", "TORCHRUN_VARS", "child_env", "launch_embedded_engines"]

log = logging.getLogger(__name__)

TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
)


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """Our environment without ``TORCHRUN_VARS``, with ``env`` on top."""
    return {**{k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}, **env}


class CommandProcess:
    """One command of the launch plan, with the process interface of ``EmbeddedEngineProcess``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        url: str,
        ready: Callable[[float], Awaitable[None]],
        log_path: str | Path | None = None,
        grace_s: float = 15.0,
    ):
        self.name, self.argv, self.env, self.url = name, list(argv), dict(env), url
        self.ready = ready
        self.log_path = Path(log_path) if log_path else None
        self.grace_s = grace_s
        self.proc: asyncio.subprocess.Process | None = None

    def __repr__(self) -> str:
        return f"CommandProcess({self.name!r}, url={self.url!r}, pid={self.pid}, returncode={self.returncode})"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    async def start(self, startup_timeout_s: float) -> str:
        """Start and wait until ready. Returns the url.

        Raises:
            EngineUnavailable: the process exited before it was ready (the log path is named).
            EngineTimeout / EngineError: from ``ready`` (the process is stopped first).
        """
        out = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = self.log_path.open("ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *with_lifeline(self.argv),
                env=child_env(self.env),
                stdout=out,
                stderr=asyncio.subprocess.STDOUT if out else None,
                start_new_session=True,
            )
        finally:
            if out is not None:
                out.close()  # the child holds its own descriptor
        log.info("started %s (pid %d): %s", self.name, self.proc.pid, " ".join(self.argv))
        waiting = asyncio.ensure_future(self.ready(startup_timeout_s))
        exited = asyncio.ensure_future(self.proc.wait())
        try:
            await asyncio.wait({waiting, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
            waiting.cancel()  # no-op when done
        error = waiting.exception() if waiting.done() and not waiting.cancelled() else None
        if waiting.done() and not waiting.cancelled() and error is None:
            return self.url
        await self.stop()
        if error is not None:
            raise error
        where = f"; see {self.log_path}" if self.log_path else ""
        raise EngineUnavailable(
            f"{self.name} exited with code {self.proc.returncode} before it was ready{where}",
            url=self.url,
            endpoint="(launch)",
        )

    async def restart(self, startup_timeout_s: float) -> str:
        """Stop (if still running) and start the same command again. Returns the url."""
        await self.stop()
        return await self.start(startup_timeout_s)

    async def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``. Idempotent."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(self.grace_s):
                await self.proc.wait()
        except TimeoutError:
            log.warning(
                "%s (pid %d) ignored SIGTERM for %.0fs; killing its process group",
                self.name,
                self.proc.pid,
                self.grace_s,
            )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers of the tree, even when the leader exited
        await self.proc.wait()


READY_PREFIX = "SLIME_ENGINE_READY url="


class EmbeddedEngineProcess:
    """One embedded engine child process; ``url`` is set once it is ready."""

    def __init__(
        self,
        model_dir: str,
        *,
        threads: int = 1,
        max_running_requests: int = 256,
        weight_version: str = "0",
        seed: int = 0,
    ):
        self.args = [
            sys.executable,
            "-m",
            "slime.servers.embedded.server",
            "--model",
            model_dir,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--threads",
            str(threads),
            "--max-running-requests",
            str(max_running_requests),
            "--weight-version",
            weight_version,
            "--seed",
            str(seed),
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
        self.proc = proc = await asyncio.create_subprocess_exec(
            *with_lifeline(self.args), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
        )
        assert proc.stdout is not None  # stdout=PIPE
        tail: list[str] = []
        try:
            async with asyncio.timeout(startup_timeout_s):
                while True:
                    raw = await proc.stdout.readline()
                    if not raw:
                        rc = await proc.wait()
                        raise EngineUnavailable(
                            f"embedded engine exited with code {rc} before it was ready; last output:\n"
                            + "".join(tail[-20:]),
                            endpoint="(launch)",
                        )
                    line = raw.decode(errors="replace")
                    tail.append(line)
                    if line.startswith(READY_PREFIX):
                        self.url = line[len(READY_PREFIX) :].strip()
                        break
        except TimeoutError:
            await self.stop()
            raise EngineUnavailable(
                f"embedded engine not ready after {startup_timeout_s}s; last output:\n" + "".join(tail[-20:]),
                endpoint="(launch)",
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
async def launch_embedded_engines(
    model_dir: str,
    *,
    num_engines: int,
    threads: int,
    max_running_requests: int,
    startup_timeout_s: float,
    seed: int = 0,
    weight_version: str = "0",
) -> AsyncIterator[list[str]]:
    """Start ``num_engines`` embedded engines at ``weight_version``; yield their URLs; stop them on exit."""
    procs = [
        EmbeddedEngineProcess(
            model_dir,
            threads=threads,
            max_running_requests=max_running_requests,
            seed=seed + i,
            weight_version=weight_version,
        )
        for i in range(num_engines)
    ]
    try:
        urls = await asyncio.gather(*(p.start(startup_timeout_s) for p in procs))
        log.info("embedded engines ready: %s", ", ".join(urls))
        yield list(urls)
    finally:
        await asyncio.gather(*(p.stop() for p in procs), return_exceptions=True)
