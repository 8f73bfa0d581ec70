"""Per-step progress: a rich progress bar on a terminal, plain lines otherwise.

Either way every step prints its one summary line (``slime.loop.outputs.format_step_line``), followed by
``| eval A @ step S`` once an eval has an accuracy. On a TTY the line is printed above a live bar showing
steps done, the latest reward, accuracy, eval accuracy and tokens/s, within the running step the groups
ready of the step's target (``watch``), elapsed and remaining time; while the bar is live the console's log
lines (the root logger's plain ``StreamHandler`` on stderr or stdout) are printed above it, never glued onto
it. Redirected to a file or a pipe (CI, ``nohup``), or with ``slime train --no-progress``, only the lines are
printed, one per step, flushed at once.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from typing import Any, TextIO

from slime.step_record import MetricsRow

__all__ = ["StepProgress"]


class StepProgress:
    """Progress over ``total`` rollout steps.

    Args:
        total: how many steps the run has.
        enabled: False = plain lines whatever the output is (``--no-progress``).
        stream: where to write (default ``sys.stdout``); the bar needs ``stream.isatty()``.
    """

    def __init__(self, total: int, *, enabled: bool = True, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.total = total
        self.num_done = 0
        self.last_eval: tuple[int, float] | None = None
        """``(step, accuracy)`` of the latest eval with an accuracy."""
        self._ready: Callable[[], int] | None = None
        self._target = 0
        self._progress: Any = None
        self._task: Any = None
        self._moved: list[tuple[logging.StreamHandler[Any], Any]] = []  # log handlers sent above the bar, their streams
        if enabled and _isatty(self.stream):
            self._start_bar()

    def watch(self, ready: Callable[[], int], target: int) -> None:
        """Show, within a step, ``ready()`` of the ``target`` groups a step takes (read at each refresh of the bar)."""
        self._ready, self._target = ready, target

    def _within_step(self) -> str:
        if self._ready is None or self.num_done >= self.total:
            return ""
        return f"step {self.num_done + 1}: {min(self._ready(), self._target)}/{self._target} groups"

    @property
    def uses_bar(self) -> bool:
        return self._progress is not None

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console(file=self.stream)
        self._progress = Progress(
            TextColumn("[bold]rollout steps"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "reward {task.fields[reward]} acc {task.fields[accuracy]} eval {task.fields[eval]} "
                "tok/s {task.fields[tokens_per_s]}"
            ),
            _callback_column(self._within_step),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            refresh_per_second=2,
        )
        self._task = self._progress.add_task(
            "steps", total=self.total, reward="-", accuracy="-", eval="-", tokens_per_s="-"
        )
        streams = sys.stdout, sys.stderr
        self._progress.start()  # on a terminal rich swaps sys.stdout / sys.stderr for proxies printing above the bar
        self._moved = _log_above(streams, (sys.stdout, sys.stderr))

    def step(self, line: str, record: MetricsRow) -> None:
        """One finished step: print its summary line (with the latest eval accuracy) and advance the bar."""
        self.num_done += 1
        if self.last_eval is not None:
            line = f"{line} | eval {self.last_eval[1]:.3f} @ step {self.last_eval[0]}"
        if self._progress is None:
            print(line, file=self.stream, flush=True)
            return
        self._progress.console.print(line, markup=False, highlight=False)
        self._progress.update(
            self._task,
            advance=1,
            reward=_fmt(record.get("reward_mean"), ".3f"),
            accuracy=_fmt(record.get("accuracy"), ".3f"),
            tokens_per_s=_fmt(record.get("tokens_per_s"), ".0f"),
        )

    def eval_result(self, record: MetricsRow) -> None:
        """An eval's record: its accuracy (when it has one) goes on the bar and after the next step lines."""
        accuracy, step = record.get("accuracy"), record.get("step")
        # an eval with no eval set has no accuracy (None, or NaN in a record read back)
        if not isinstance(accuracy, (int, float)) or not math.isfinite(accuracy) or not isinstance(step, int):
            return
        self.last_eval = (step, float(accuracy))
        if self._progress is not None:
            self._progress.update(self._task, eval=_fmt(accuracy, ".3f"))

    def note(self, line: str) -> None:
        """A line that is not a step (an eval result)."""
        if self._progress is None:
            print(line, file=self.stream, flush=True)
        else:
            self._progress.console.print(line, markup=False, highlight=False)

    def close(self) -> None:
        """Stop the bar (leaving its last state on screen). Idempotent."""
        progress, self._progress = self._progress, None
        for handler, stream in self._moved:
            handler.setStream(stream)
        self._moved = []
        if progress is not None:
            progress.stop()


def _log_above(before: tuple[Any, Any], now: tuple[Any, Any]) -> list[tuple[logging.StreamHandler[Any], Any]]:
    """Point the root logger's plain console handlers at the proxies rich put in place of ``sys.stdout`` /
    ``sys.stderr`` (``before`` -> ``now``), so their lines print above the bar; the handlers moved, with their
    streams. (A handler keeps the stream it was made with, so rich's swap alone would not reach it.)"""
    moved: list[tuple[logging.StreamHandler[Any], Any]] = []
    for handler in logging.getLogger().handlers:
        if type(handler) is not logging.StreamHandler:  # files and capture handlers stay as they are
            continue
        for old, proxy in zip(before, now):
            if handler.stream is old and proxy is not old:
                moved.append((handler, handler.setStream(proxy)))
                break
    return moved


def _callback_column(text: Callable[[], str]) -> Any:
    """A rich ``ProgressColumn`` showing ``text()`` at each refresh of the bar (rich's threads call it)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Column(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(text())

    return Column()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or bare stream
        return False


def _fmt(value: object, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"
