"""A Chrome / Perfetto trace of one run (``--enable-trace`` -> ``RUN_DIR/trace.json``).

Open the file in https://ui.perfetto.dev or ``chrome://tracing``. Format: the Trace Event Format's
object form, ``{"displayTimeUnit": "ms", "traceEvents": [...]}``, with

- complete events (``ph: "X"``, ``ts`` and ``dur`` in integer microseconds since the tracer
  started): one per rollout request (per sample per segment: group id, sample index, tokens,
  finish, version), reward call, train step, weight-sync phase (save / pause / load / resume), eval;
- instant events (``ph: "i"``): policy version bumps;
- counter events (``ph: "C"``): requests in flight, ready / partial groups, tokens/s;
- metadata events (``ph: "M"``): the name and order of each track.

Tracks (``tid``): ``driver`` holds the step's phases, which nest (``step`` > ``train_step``,
``weight_sync`` > ``save``, ``pause``, ``load``, ``resume``). Concurrent requests go to lanes
(``rollout 0``, ``rollout 1``, ...): a request takes the lowest free lane and frees it when it
returns, so events on one lane never overlap and there are as many lanes as the peak concurrency.

Cost on the hot path: one tuple appended per event; dicts and JSON are built only when flushing.
``flush()`` runs every ``flush_interval_s`` (checked when an event ends) and at ``close()``. It
appends the new events and rewrites the closing ``]}``, so the file is valid JSON after every flush
and a crashed run keeps everything up to its last flush. About 200 bytes per event on disk.

Call every method from the event loop's thread (the train step's worker thread records nothing).
A disabled run gets ``NULL_TRACER``, whose methods do nothing.
"""

from __future__ import annotations

import heapq
import os
import time
from pathlib import Path
from typing import BinaryIO

import msgspec

__all__ = ["Tracer", "NullTracer", "NULL_TRACER", "RunTracer", "open_tracer"]

_HEADER = b'{"displayTimeUnit": "ms", "traceEvents": [\n'
_FOOTER = b"\n]}\n"
_encode = msgspec.json.Encoder(enc_hook=str).encode
# An event before serialisation: (ph, name, cat, tid, start_ns, dur_ns, args).
_Event = tuple[str, str, str, int, int, int, dict[str, object]]


class _Span:
    """``with tracer.span(...) as args:`` records one complete event; add result fields to ``args``."""

    __slots__ = ("tracer", "name", "cat", "track", "args", "start")

    def __init__(self, tracer: Tracer, name: str, cat: str, track: str, args: dict[str, object]):
        self.tracer, self.name, self.cat, self.track, self.args = tracer, name, cat, track, args
        self.start = 0

    def __enter__(self) -> dict[str, object]:
        self.start = time.perf_counter_ns()
        return self.args

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.args["error"] = exc_type.__name__
        self.tracer.complete(self.name, self.cat, self.start, track=self.track, **self.args)


class Tracer:
    """Records trace events and writes them to ``path``.

    Args:
        path: the output file (``RUN_DIR/trace.json``); created at the first flush.
        flush_interval_s: how often new events are appended to the file; 0 = after every event.
        process_name: the name the viewer shows for this process.
    """

    enabled = True

    def __init__(self, path: str | Path, *, flush_interval_s: float = 5.0, process_name: str = "slime driver"):
        self.path = Path(path)
        self._interval_ns = int(flush_interval_s * 1e9)
        self._pid = os.getpid()
        self._t0_ns = time.perf_counter_ns()
        self._last_flush_ns = self._t0_ns
        self._pending: list[_Event] = [("M", "process_name", "__metadata", 0, self._t0_ns, 0, {"name": process_name})]
        self._tids: dict[str, int] = {}
        self._free_lanes: dict[str, list[int]] = {}
        self._num_lanes: dict[str, int] = {}
        self._file: BinaryIO | None = None
        self._num_written = 0
        self._closed = False

    # -- recording -------------------------------------------------------------------------------

    @staticmethod
    def now() -> int:
        """A timestamp for ``complete(start_ns=...)`` (``time.perf_counter_ns``)."""
        return time.perf_counter_ns()

    def _tid(self, track: str) -> int:
        tid = self._tids.get(track)
        if tid is None:
            tid = self._tids[track] = len(self._tids) + 1
            self._pending.append(("M", "thread_name", "__metadata", tid, self._t0_ns, 0, {"name": track}))
            self._pending.append(("M", "thread_sort_index", "__metadata", tid, self._t0_ns, 0, {"sort_index": tid}))
        return tid

    def begin(self, name: str, cat: str, *, lanes: str = "rollout") -> tuple[str, str, str, int, int]:
        """Open an event on the lowest free lane of ``lanes``; pass the token to ``end``."""
        free = self._free_lanes.setdefault(lanes, [])
        if free:
            tid = heapq.heappop(free)
        else:
            lane = self._num_lanes[lanes] = self._num_lanes.get(lanes, -1) + 1
            tid = self._tid(f"{lanes} {lane}")
        return (name, cat, lanes, tid, time.perf_counter_ns())

    def end(self, token: tuple[str, str, str, int, int], **args: object) -> None:
        """Close the event opened by ``begin`` (its lane becomes free) with ``args``."""
        name, cat, lanes, tid, start = token
        now = time.perf_counter_ns()
        heapq.heappush(self._free_lanes[lanes], tid)
        self._pending.append(("X", name, cat, tid, start, now - start, args))
        if now - self._last_flush_ns >= self._interval_ns:
            self.flush()

    def complete(self, name: str, cat: str, start_ns: int, *, track: str = "driver", **args: object) -> None:
        """Record an event on ``track`` that started at ``start_ns`` (``now()``) and ends now."""
        now = time.perf_counter_ns()
        self._pending.append(("X", name, cat, self._tid(track), start_ns, now - start_ns, args))
        if now - self._last_flush_ns >= self._interval_ns:
            self.flush()

    def span(self, name: str, cat: str, *, track: str = "driver", **args: object) -> _Span:
        """Context manager for ``complete``; yields ``args`` so the body can add results."""
        return _Span(self, name, cat, track, args)

    def instant(self, name: str, cat: str, *, track: str = "driver", **args: object) -> None:
        self._pending.append(("i", name, cat, self._tid(track), time.perf_counter_ns(), 0, args))

    def counter(self, name: str, **values: float) -> None:
        """One sample of a counter track; each keyword is a series (``requests=12``)."""
        self._pending.append(("C", name, "counter", 0, time.perf_counter_ns(), 0, dict[str, object](values)))

    # -- output ----------------------------------------------------------------------------------

    def _to_dict(self, event: _Event) -> dict[str, object]:
        ph, name, cat, tid, start, dur, args = event
        ts = (start - self._t0_ns) // 1000
        out: dict[str, object] = {
            "ph": ph,
            "name": name,
            "cat": cat,
            "pid": self._pid,
            "tid": tid,
            "ts": ts,
            "args": args,
        }
        if ph == "X":  # both ends floored to whole microseconds, so nested spans stay nested
            out["dur"] = (start + dur - self._t0_ns) // 1000 - ts
        elif ph == "i":
            out["s"] = "t"
        return out

    def flush(self) -> None:
        """Append the events recorded since the last flush; the file stays valid JSON."""
        self._last_flush_ns = time.perf_counter_ns()
        if self._closed or (not self._pending and self._file is not None):
            return
        body = b",\n".join(_encode(self._to_dict(e)) for e in self._pending)
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("wb")
            self._file.write(_HEADER)
        else:
            self._file.seek(-len(_FOOTER), os.SEEK_END)
            if self._num_written and body:
                self._file.write(b",\n")
        self._file.write(body + _FOOTER)
        self._file.flush()
        self._num_written += len(self._pending)
        self._pending.clear()

    def close(self) -> None:
        """Flush and close the file. Idempotent; later events are dropped."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._pending.clear()
        if self._file is not None:
            self._file.close()


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> dict[str, object]:
        return {}

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_SPAN = _NullSpan()


class NullTracer:
    """The disabled tracer: same methods, nothing recorded."""

    enabled = False

    @staticmethod
    def now() -> int:
        return 0

    def begin(self, name: str, cat: str, *, lanes: str = "rollout") -> None:
        return None

    def end(self, token: object, **args: object) -> None:
        return None

    def complete(self, name: str, cat: str, start_ns: int, *, track: str = "driver", **args: object) -> None:
        return None

    def span(self, name: str, cat: str, *, track: str = "driver", **args: object) -> _NullSpan:
        return _NULL_SPAN

    def instant(self, name: str, cat: str, *, track: str = "driver", **args: object) -> None:
        return None

    def counter(self, name: str, **values: float) -> None:
        return None

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


NULL_TRACER = NullTracer()
"""Stateless, so one shared instance is safe."""


RunTracer = Tracer | NullTracer
"""The tracer a run holds: a ``Tracer`` (``--enable-trace``) or ``NULL_TRACER`` (``open_tracer``)."""


def open_tracer(enabled: bool, path: str | Path, *, flush_interval_s: float = 5.0) -> RunTracer:
    """``Tracer(path)`` when ``enabled`` (``--enable-trace``), else ``NULL_TRACER``."""
    return Tracer(path, flush_interval_s=flush_interval_s) if enabled else NULL_TRACER
