"""What a resume reads: a checkpoint's loop state, and which checkpoint of a run is complete.

``--load RUN_DIR`` resumes from ``RUN_DIR/checkpoints/latest`` when that checkpoint is complete
(``checkpoint_problem``: the files ``manifest.json`` lists at their sizes, ``loop.json`` a
``LoopState``, ``model/`` an HF directory; no tensor is read), else from the newest complete
``step_*``, with one line saying what was wrong with each one passed over (``resume_checkpoint``);
with none complete it stops with that line. Writing, and restoring the trainer, is
``slime.loop.checkpoint``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import zipfile
from pathlib import Path
from typing import Any

import msgspec

from slime.errors import CheckpointError
from slime.hf_checkpoint import check_hf_dir
from slime.types import Group

_log = logging.getLogger(__name__)

__all__ = [
    "LoopState",
    "CheckpointScan",
    "read_loop_state",
    "checkpoint_problem",
    "scan_checkpoints",
    "latest_checkpoint",
    "resume_checkpoint",
    "step_dirs",
    "step_of",
    "file_label",
    "first_line",
]

STEP_DIR = re.compile(r"step_(\d+)")
"""A checkpoint folder's name: ``step_000012``."""


class LoopState(msgspec.Struct, kw_only=True):
    step: int
    policy_version: int
    source: dict[str, int]
    """The prompt (or SFT row) position (``PromptSource.state_dict``)."""
    # the scheduler and buffer (an SFT run has neither: the defaults)
    next_group_id: int = 0
    num_admitted: int = 0
    rollout_id: int = 0
    taken: list[int] = []
    ready: list[Group] = []
    partial: list[Group] = []
    num_evicted: int = 0
    """Partial groups the buffer evicted at ``--buffer-capacity`` (``DataBuffer.num_evicted``)."""
    num_expired: int = 0
    """Partial groups the buffer expired at ``--max-staleness`` (``DataBuffer.num_expired``)."""
    offline_source: dict[str, int] | None = None
    """Position in ``--offline-data`` (``OfflineSource.state_dict``); None without offline data."""
    python_rng: Any = None


@dataclasses.dataclass
class CheckpointScan:
    """What ``scan_checkpoints`` found: the checkpoint to resume from, and why newer ones were passed over."""

    path: Path | None
    """The newest complete checkpoint (``latest`` when it is complete), or None."""
    skipped: list[str]
    """One phrase per checkpoint (or ``latest`` file) passed over, naming its file and step."""


def latest_checkpoint(save_dir: str | Path) -> Path | None:
    """The checkpoint a ``--load`` resumes from: ``latest`` when complete, else the newest complete one, else None."""
    return scan_checkpoints(save_dir).path


def scan_checkpoints(save_dir: str | Path) -> CheckpointScan:
    """Find the checkpoint to resume from in ``save_dir`` (``RUN_DIR/checkpoints``); see the module doc."""
    root = Path(save_dir)
    skipped: list[str] = []
    named = _read_latest(root, skipped)
    if named is not None:
        if (why := checkpoint_problem(named)) is None:
            return CheckpointScan(named, skipped)
        skipped.append(why)
    for path in sorted(step_dirs(root), key=step_of, reverse=True):
        if path == named:
            continue
        if (why := checkpoint_problem(path)) is None:
            return CheckpointScan(path, skipped)
        skipped.append(why)
    return CheckpointScan(None, skipped)


def resume_checkpoint(load: str | Path, *, warn: bool = True) -> Path | None:
    """The checkpoint ``--load RUN_DIR`` resumes from, or None when the run has none.

    With ``warn``, a fallback past damaged checkpoints logs one line saying what was wrong and which one is used.

    Raises:
        CheckpointError: checkpoints exist but none is complete; one line naming each one's file and step.
    """
    scan = scan_checkpoints(Path(load) / "checkpoints")
    reasons = "; ".join(scan.skipped[:3]) + (f"; and {len(scan.skipped) - 3} more" if len(scan.skipped) > 3 else "")
    if scan.path is None and scan.skipped:
        raise CheckpointError(f"--load={str(load)!r}: no complete checkpoint to resume from: {reasons}")
    if scan.path is not None and scan.skipped and warn:
        _log.warning("--load %s: %s; resuming from the newest complete checkpoint, %s", load, reasons, scan.path.name)
    return scan.path


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a complete checkpoint (one phrase naming the step and the file), or None when it is.

    Checks the manifest's files at their sizes (a checkpoint written before manifests: ``trainer.pt`` a
    non-empty zip), ``loop.json`` decoding as a ``LoopState`` and ``model/`` an HF directory
    (``slime.hf_checkpoint.check_hf_dir``); reads no tensor.
    """
    path = Path(path)
    if not path.is_dir():
        return f"checkpoint {path.name}: {path} does not exist"
    problem = _manifest_problem(path) if (path / "manifest.json").exists() else _legacy_problem(path)
    if problem is not None:
        return problem
    try:
        read_loop_state(path)
        check_hf_dir(path / "model")
    except CheckpointError as exc:
        return str(exc) if str(exc).startswith("checkpoint step") else f"{_step_label(path)}: {exc}"
    return None


def read_loop_state(path: str | Path) -> LoopState:
    """``path/loop.json`` as a ``LoopState``.

    Raises:
        CheckpointError: missing, unreadable, invalid JSON or of the wrong shape; names the file and the step.
    """
    path = Path(path)
    where = file_label(path, "loop.json")
    try:
        raw = (path / "loop.json").read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot be read ({exc.strerror})") from exc
    try:
        return msgspec.json.decode(raw, type=LoopState)
    except msgspec.ValidationError as exc:
        raise CheckpointError(f"{where}: not a loop state ({exc})") from exc
    except msgspec.DecodeError as exc:
        raise CheckpointError(f"{where}: truncated or garbled JSON ({exc})") from exc


def _read_latest(root: Path, skipped: list[str]) -> Path | None:
    """The folder ``latest`` names, or None (and why, into ``skipped``, when it is missing or unreadable but checkpoints exist)."""
    latest = root / "latest"
    try:
        name = latest.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        if step_dirs(root):
            skipped.append(f"{latest}: {'missing' if isinstance(exc, FileNotFoundError) else 'unreadable'}")
        return None
    if not STEP_DIR.fullmatch(name):
        skipped.append(f"{latest}: names no checkpoint ({name[:40]!r})")
        return None
    if not (root / name).is_dir():
        skipped.append(f"{latest} names {name}, which does not exist (a save cut short)")
        return None
    return root / name


def _manifest_problem(path: Path) -> str | None:
    manifest = path / "manifest.json"
    try:
        files = json.loads(manifest.read_text())["files"]
        sizes = {str(k): int(v) for k, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{file_label(path, 'manifest.json')}: unreadable ({first_line(exc)})"
    for rel, size in sizes.items():
        file = path / rel
        if not file.is_file():
            return f"{file_label(path, rel)}: missing"
        if (actual := file.stat().st_size) != size:
            return f"{file_label(path, rel)}: {actual} bytes, {size} when saved (truncated or changed)"
    return None


def _legacy_problem(path: Path) -> str | None:
    """A checkpoint written before manifests: ``trainer.pt`` present and a zip (torch's format)."""
    pt = path / "trainer.pt"
    if not pt.is_file():
        return f"{file_label(path, 'trainer.pt')}: missing"
    if pt.stat().st_size == 0 or not zipfile.is_zipfile(pt):
        return f"{file_label(path, 'trainer.pt')}: {pt.stat().st_size} bytes, truncated or corrupt (not a torch file)"
    return None


def step_dirs(root: Path) -> list[Path]:
    """The ``step_*`` folders of ``root`` (``RUN_DIR/checkpoints``), in no order; none when it does not exist."""
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if STEP_DIR.fullmatch(p.name) and p.is_dir()]


def step_of(path: Path) -> int:
    """The step of a ``step_000012`` folder (12); -1 for another name."""
    m = STEP_DIR.fullmatch(path.name)
    return int(m.group(1)) if m else -1


def _step_label(path: Path) -> str:
    step = step_of(path)
    return f"checkpoint step {step}" if step >= 0 else f"checkpoint {path}"


def file_label(path: Path, name: str) -> str:
    """``checkpoint step 12: RUN/checkpoints/step_000012/loop.json``: the start of a line about a checkpoint's file."""
    return f"{_step_label(path)}: {path / name}"


def first_line(exc: BaseException) -> str:
    """``Type: the first line of the message`` (at most 200 characters) of an error quoted in a one-line message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
