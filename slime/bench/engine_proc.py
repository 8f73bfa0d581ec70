"""A simulated engine in its own process: ``python -m slime.servers.sim.server --port 0 ...``.

The benchmark measures the client's CPU with ``time.process_time()``, so the engine must not share
the process. ``sim_engine_process(flags)`` starts one, waits for its ``SLIME_ENGINE_READY url=`` line,
yields the URL, and stops it (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``) on exit. Small
helpers read and reset its ``/sim_stats`` counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import msgspec

from slime.engines.fleet.lifeline import with_lifeline
from slime.servers.http import READY_PREFIX

__all__ = ["EngineProcess", "sim_engine_process", "reset_sim_stats", "read_sim_stats", "process_cpu_s"]

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
STATS_TIMEOUT_S = 30.0


class EngineProcess(msgspec.Struct):
    url: str
    pid: int


@contextlib.asynccontextmanager
async def sim_engine_process(flags: Sequence[str]) -> AsyncIterator[EngineProcess]:
    """Serve a ``SimEngine`` with ``flags`` (``slime engine --sim`` flags) on 127.0.0.1, a free port.

    Raises:
        RuntimeError: the process exited, or printed no ready line within ``START_TIMEOUT_S``.
    """
    cmd = [
        sys.executable,
        "-W",
        "ignore::RuntimeWarning:runpy",
        "-m",
        "slime.servers.sim.server",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *flags,
    ]
    # with a parent-death signal: a killed benchmark leaves no engine behind
    proc = await asyncio.create_subprocess_exec(
        *with_lifeline(cmd), stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
    )
    try:
        url = await _ready_url(proc, cmd)
        yield EngineProcess(url=url, pid=proc.pid)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _ready_url(proc: asyncio.subprocess.Process, cmd: list[str]) -> str:
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while line := (await proc.stdout.readline()).decode(errors="replace"):
                if line.startswith(READY_PREFIX):
                    return line[len(READY_PREFIX) :].strip()
    except TimeoutError:
        raise RuntimeError(f"no {READY_PREFIX!r} line within {START_TIMEOUT_S}s from {' '.join(cmd)}") from None
    await proc.wait()
    raise RuntimeError(f"simulated engine exited with code {proc.returncode} before serving: {' '.join(cmd)}")


async def reset_sim_stats(session: aiohttp.ClientSession, urls: Sequence[str]) -> bool:
    """``POST /sim_stats/reset`` on every engine; False if one does not serve it (not a sim engine)."""
    ok = True
    for url in urls:
        async with session.post(url + "/sim_stats/reset", timeout=aiohttp.ClientTimeout(total=STATS_TIMEOUT_S)) as resp:
            ok &= resp.status == 200
    return ok


async def read_sim_stats(session: aiohttp.ClientSession, urls: Sequence[str]) -> list[dict[str, Any]] | None:
    """``GET /sim_stats`` of every engine, or None when one does not serve it."""
    out = []
    for url in urls:
        async with session.get(url + "/sim_stats", timeout=aiohttp.ClientTimeout(total=STATS_TIMEOUT_S)) as resp:
            if resp.status != 200:
                return None
            out.append(msgspec.json.decode(await resp.read()))
    return out


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process (Linux ``/proc``); None elsewhere or once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
