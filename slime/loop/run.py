"""The run skeleton shared by the RL run (``slime.loop.driver``) and the SFT run (``slime.loop.sft``).

::

    files = open_run(run_dir, load, trained_log, config)   # RUN_DIR, config.json, resume point, metrics + trained logs
    ... the mode builds its trainer, data and (RL) engines, restores the checkpoint ...
    async with Observers(...) as obs:
        await run_steps(mode, files, obs, ...)              # eval before, steps, evals, checkpoints
        ... the mode's final eval ...
    finish_run(files, summary)                              # summary.json, report.txt (and the plots)

One run per run folder: ``run_training`` and ``run_sft`` are wrapped in ``holds_run_folders``, which
holds the lock of every folder the run writes into or resumes from (``run_folders``) for the whole
run, so a second run on one of them is refused before it writes anything (``slime.loop.run_lock``).

A mode is a ``RunMode`` (``slime.loop.interface``): what one step does, how it evaluates, what its checkpoint holds. The
skeleton owns the order: an eval before the first step of a fresh run (unless
``--skip-eval-before-train``), every step's record written, then an eval every ``eval_interval``
steps (not after the last: the mode's final eval follows the loop), then a checkpoint every
``save_interval`` steps and after the last.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

import msgspec

from slime.loop.checkpoint import LoopState, open_run_dir, save_checkpoint
from slime.loop.interface import Record, RunMode
from slime.loop.outputs import JsonlLog, MetricsWriter, write_json_atomic
from slime.loop.run_lock import hold_run_folders
from slime.obs.observers import Observers
from slime.step_record import RunSummary, StepRecord

if TYPE_CHECKING:
    from slime.config import Config

__all__ = [
    "RunFiles",
    "RunMode",
    "open_run",
    "run_steps",
    "finish_run",
    "run_folders",
    "holds_run_folders",
    "fresh_run_dir",
    "point_latest",
]

P = ParamSpec("P")
T = TypeVar("T")


@dataclasses.dataclass
class RunFiles:
    """A run's directory and the logs it appends to."""

    run_dir: Path
    checkpoint: Path | None
    """The checkpoint to resume from (``--load``), or None."""
    resume: LoopState | None
    metrics: MetricsWriter
    trained_log: JsonlLog
    t_start: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def first_step(self) -> int:
        return self.resume.step + 1 if self.resume else 1

    def seconds(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.t_start


def run_folders(config: Config) -> list[tuple[str, str]]:
    """``(flag, folder)`` of each folder a run writes into or resumes from: ``--save`` (the run directory),
    ``--load``, and a disk weight sync's ``weights_dir`` (the sync section) outside the run directory."""
    folders = [("--save", config.run_dir)]
    if config.load:
        folders.append(("--load", config.load))
    weights = config.sync.weights_dir
    if (
        config.sync.method == "disk"
        and weights
        and not Path(os.path.realpath(weights)).is_relative_to(os.path.realpath(config.run_dir))
    ):
        folders.append(("weights_dir", weights))
    return folders


def fresh_run_dir(latest: str) -> str:
    """A new run folder beside ``latest`` (``Config.run_dir``'s default, ``runs/latest``) for a run without ``--save``:
    ``runs/<YYYYmmdd-HHMMSS>`` of the launch (``-2``, ``-3``, ... when one of that second exists). Under torchrun every
    local rank names the same folder: the launcher's start time (a multi-node run passes ``--save``)."""
    root = Path(latest).parent
    name = time.strftime("%Y%m%d-%H%M%S", time.localtime(_launch_time()))
    if "LOCAL_RANK" in os.environ:  # ranks do not race to take suffixes: they agree on the launcher's second
        return str(root / name)
    candidate, n = root / name, 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = root / f"{name}-{n}"
    return str(candidate)


def _launch_time() -> float:
    """Now; under torchrun (``LOCAL_RANK`` set) the start of the launcher, the ranks' parent (``/proc``), which
    every local rank reads alike."""
    if "LOCAL_RANK" not in os.environ:
        return time.time()
    try:
        stat = Path(f"/proc/{os.getppid()}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        boot = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):  # no /proc (not Linux): each rank's own clock
        return time.time()


def point_latest(latest: str, run_dir: str) -> bool:
    """Make ``latest`` (``runs/latest``) a symlink to ``run_dir``, replacing an older link atomically; a real folder
    there (a run of an older slime) is left alone. Returns whether the link points at ``run_dir``."""
    link, target = Path(latest), Path(run_dir)
    if link.exists() and not link.is_symlink():
        return False
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    # relative: the runs folder can be moved or mounted elsewhere and the link still resolves
    tmp.symlink_to(os.path.relpath(target, link.parent), target_is_directory=True)
    os.replace(tmp, link)
    return True


def holds_run_folders(
    run: Callable[Concatenate[Config, P], Awaitable[T]],
) -> Callable[Concatenate[Config, P], Awaitable[T]]:
    """Wrap a run (``run_training``, ``run_sft``) so it holds its ``run_folders`` for its whole life.

    The wrapped run raises ``slime.loop.run_lock.RunFolderInUse`` (one line naming the live holder's
    pid, host and start) before it writes anything when another run holds one of them."""

    @functools.wraps(run)
    async def locked(config: Config, *args: P.args, **kwargs: P.kwargs) -> T:
        with hold_run_folders(run_folders(config)):
            return await run(config, *args, **kwargs)

    return locked


def open_run(run_dir: str | Path, load: str | None, trained_log: str, config: Config) -> RunFiles:
    """Create ``run_dir``, find the checkpoint to resume from, cut the logs back to it and write ``config.json``."""
    path, ckpt, resume = open_run_dir(run_dir, load, ("metrics.jsonl", trained_log))
    write_json_atomic(path / "config.json", msgspec.to_builtins(config))
    # like metrics.jsonl, the trained log is created by its first line
    return RunFiles(path, ckpt, resume, MetricsWriter(path), JsonlLog(path / trained_log))


async def run_steps(
    mode: RunMode[Record],
    files: RunFiles,
    obs: Observers,
    *,
    num_steps: int,
    eval_interval: int | None,
    save_interval: int | None,
    eval_before: bool,
) -> None:
    """The step loop (see the module doc). ``eval_before``: evaluate before the first step of a fresh run."""
    if files.resume is None and eval_before:
        await mode.evaluate(0)
    for step in range(files.first_step, num_steps + 1):
        record, trained = await mode.step(step)
        record.step = step
        if isinstance(record, StepRecord):
            record.time_s = round(files.seconds(), 4)
        row = record.to_dict()
        files.metrics.write(row)
        for line in trained:
            files.trained_log.write(line)
        obs.record(row, mode.step_line(record))
        if eval_interval and step % eval_interval == 0 and step < num_steps:
            await mode.evaluate(step)
        if mode.trainer is not None and save_interval and (step % save_interval == 0 or step == num_steps):
            async with mode.quiesced():
                state = mode.loop_state(step)
                with obs.tracer.span("checkpoint", "checkpoint", step=step):
                    await asyncio.to_thread(
                        save_checkpoint, files.run_dir / "checkpoints", state, trainer=mode.trainer,
                        pinned=files.checkpoint,  # the engines' launch weights: a restart reads them again
                    )  # fmt: skip


def finish_run(files: RunFiles, summary: RunSummary, *, plots: bool = True) -> None:
    """Close the logs; write ``summary.json``, the plots (``slime.obs.plots``) and ``report.txt``."""
    from slime.obs.plots import write_plots
    from slime.obs.report import format_report, load_run, summarize

    files.metrics.close()
    files.trained_log.close()
    write_json_atomic(files.run_dir / "summary.json", summary)
    if plots:
        write_plots(files.metrics.records, files.run_dir)
    (files.run_dir / "report.txt").write_text(format_report(files.run_dir, summarize(*load_run(files.run_dir))) + "\n")
