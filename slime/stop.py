"""SIGTERM honoured in every phase of ``slime train``: startup, data loading, eval, rollout, training.

One process-wide stop request, set by the SIGTERM handler that ``slime.cli`` installs:

- startup (``sigterm_raises``, sync code in the main thread: flag parsing, preflight, imports): the handler
  raises ``Stopped`` where the main thread is, at once;
- the run (``sigterm_cancels``, the asyncio loop): the handler cancels the run's main task, so every ``finally``
  runs (engines stop, logs close), and starts a watchdog: a run still alive ``grace_s`` later (its loop thread
  stuck in a plugin's sync code, a thread that never returns) is ended with one line and exit status 130; a
  second SIGTERM ends it at once. Engines die with the process either way (``slime.engines.fleet.lifeline``);
- loops that run long without awaiting (reading a prompt file, building a dataset) call ``raise_if_stopped``
  every so often, so the worker thread they run on ends and the exit does not wait for it.

The grace is ``SLIME_SIGTERM_GRACE_S`` seconds (default 10). Example: SIGTERM while 2 GB of prompts load ->
the reading thread raises ``Stopped`` within 1024 rows, the main task unwinds, and ``slime train`` prints
``slime train: interrupted (SIGTERM); run directory runs/x`` and exits 130.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

__all__ = [
    "Stopped",
    "request_stop",
    "stop_requested",
    "raise_if_stopped",
    "sigterm_raises",
    "sigterm_cancels",
    "final_line",
    "grace_s",
]

_STOP = threading.Event()
_SAID, _SAID_LOCK = threading.Event(), threading.Lock()  # the run's last line was printed


class Stopped(KeyboardInterrupt):
    """The run was asked to stop (SIGTERM). A ``KeyboardInterrupt``, so plugin boundaries that catch
    ``Exception`` let it through and ``slime train`` reports it as an interruption (exit status 130)."""


def request_stop() -> None:
    """Ask every loop that checks (``raise_if_stopped``) to stop."""
    _STOP.set()


def stop_requested() -> bool:
    return _STOP.is_set()


def clear() -> None:
    """Forget a stop request and the last line (a new run in the same process; tests)."""
    _STOP.clear()
    _SAID.clear()


def raise_if_stopped(where: str) -> None:
    """Raise ``Stopped`` when a stop was requested; ``where`` says what was cut short ("reading p.jsonl")."""
    if _STOP.is_set():
        raise Stopped(f"SIGTERM while {where}")


def grace_s() -> float:
    """Seconds a run gets to unwind after SIGTERM before it is ended (``SLIME_SIGTERM_GRACE_S``, default 10)."""
    try:
        return max(0.0, float(os.environ.get("SLIME_SIGTERM_GRACE_S", "10")))
    except ValueError:
        return 10.0


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within: SIGTERM requests a stop and raises ``Stopped("SIGTERM during startup")`` in the main thread."""

    def handler(signum: int, frame: object) -> None:
        request_stop()
        raise Stopped("SIGTERM during startup")

    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread only
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def final_line(text: str) -> None:
    """Print the run's last line (why it ended) to stderr, once: the CLI's, or the watchdog's when the CLI cannot."""
    with _SAID_LOCK:
        if _SAID.is_set():
            return
        _SAID.set()
        sys.stdout.flush()
        print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def sigterm_cancels(task: asyncio.Task, *, last_words: Callable[[], str]) -> Iterator[None]:
    """Within (on ``task``'s loop, in the main thread): SIGTERM requests a stop, cancels ``task`` and arms the
    watchdog (module docstring), which stays armed until the process ends: a worker thread that never returns
    holds up the interpreter's exit too. ``last_words()`` is the line the watchdog prints (``final_line``) when
    the CLI has not printed its own."""
    loop = asyncio.get_running_loop()

    def end_now(why: str) -> None:
        final_line(f"{last_words()} ({why})")
        os._exit(130)

    def watchdog(seconds: float) -> None:
        threading.Event().wait(seconds)
        end_now(f"it did not stop within {seconds:g}s of SIGTERM")

    def handler(signum: int, frame: object) -> None:
        if _STOP.is_set():
            end_now("a second SIGTERM")
        loop.call_soon_threadsafe(task.cancel)  # queued before any worker can see the request and fail its future
        request_stop()
        threading.Thread(target=watchdog, args=(grace_s(),), name="slime-sigterm-watchdog", daemon=True).start()

    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread only
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
