"""The sandbox's pipes: the child's stdin fed, its stdout and stderr read up to a cap, its process group killed.

``CappedReader`` keeps the first ``cap`` bytes of a stream and counts the rest; with ``stop`` it raises
``OutputOverflow`` once past the cap (``Sandbox`` ends the run there for stdout).
"""

from __future__ import annotations

import asyncio
import os
import signal

__all__ = ["OutputOverflow", "CappedReader", "feed", "kill_group"]


class OutputOverflow(Exception):
    """A run wrote more than ``max_output_bytes`` to a stream: it is killed (``SandboxResult.truncated``)."""


class CappedReader:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.cap, self.data, self.dropped = cap, bytearray(), 0

    async def drain(self, stream: asyncio.StreamReader, *, stop: bool = False) -> None:
        """Read ``stream`` to EOF; with ``stop``, raise ``OutputOverflow`` once past the cap."""
        while chunk := await stream.read(65536):
            room = self.cap - len(self.data)
            self.data += chunk[:room]
            self.dropped += max(0, len(chunk) - room)
            if stop and self.dropped:
                raise OutputOverflow
            await asyncio.sleep(0)  # read() returns without yielding while data is buffered


async def feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
            await pipe.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the child exited or closed stdin without reading it all
    finally:
        pipe.close()


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
