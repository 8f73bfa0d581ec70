"""Per-step progress: a rich progress bar on a terminal, plain lines otherwise.

Either way every step prints its one summary line (``slime.loop.outputs.format_step_line``). On a
TTY the line is printed above a live bar showing steps done, the latest reward, accuracy and
tokens/s, elapsed and remaining time. Redirected to a file or a pipe (CI, ``nohup``), or with
``slime train --no-progress``, only the lines are printed, one per step, flushed at once.
"""

from __future__ import annotations

import sys
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
        self._progress: Any = None
        self._task: Any = None
        if enabled and _isatty(self.stream):
            self._start_bar()

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
            TextColumn("reward {task.fields[reward]} acc {task.fields[accuracy]} tok/s {task.fields[tokens_per_s]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            refresh_per_second=2,
        )
        self._task = self._progress.add_task("steps", total=self.total, reward="-", accuracy="-", tokens_per_s="-")
        self._progress.start()

    def step(self, line: str, record: MetricsRow) -> None:
        """One finished step: print its summary line and advance the bar."""
        self.num_done += 1
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

    def note(self, line: str) -> None:
        """A line that is not a step (an eval result)."""
        if self._progress is None:
            print(line, file=self.stream, flush=True)
        else:
            self._progress.console.print(line, markup=False, highlight=False)

    def close(self) -> None:
        """Stop the bar (leaving its last state on screen). Idempotent."""
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.stop()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or bare stream
        return False


def _fmt(value: object, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"
