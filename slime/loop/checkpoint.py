"""Exact checkpoint and resume of a whole RL run, written atomically.

A checkpoint is taken between steps with generation quiesced (gate closed, every request aborted
and returned, every group task landed in the buffer), so nothing is in flight and nothing is
half-owned. It holds everything a run needs to continue as if it had not stopped::

    SAVE/step_000012/
        model/              HF dir of the policy at the checkpoint's version (engines load it)
        trainer.pt          optimizer (and critic + its optimizer), torch RNG state, optimizer steps taken (lr schedule)
        loop.json           step, policy version, data position, next group id, admission count,
                            rollout id, ids of every group already trained (or dropped), the
                            ready and partial groups with every token, logprob and version, the
                            buffer's eviction and expiry counts, the offline-data position
        manifest.json       every file above with its size in bytes (written last)
    SAVE/latest             the name of the newest complete checkpoint (replaced atomically)

Atomicity: a checkpoint is written into ``.tmp-step_N`` and renamed to ``step_N`` only when
complete; ``latest`` is then replaced by rename. A ``kill -9`` at any moment leaves either the
previous checkpoint or the new one as ``latest``, never a torn one. Leftover ``.tmp-*`` folders are
removed at the next save. On resume the metrics and trained-group logs are cut back to the
checkpoint's step, so the steps replayed after it are not counted twice.

Damage: ``--load`` resumes from ``latest`` when it is complete, else from the newest complete
``step_*``, saying in one line what was wrong with each one passed over; with none complete it stops
with that line (``slime.loop.resume``). A file that still fails to load is one line naming the file
and the step (``CheckpointError``). A save that finds the disk full (``ENOSPC``) removes its partial
folder and stops the run with one line naming the disk and the space needed (``DiskFullError``);
``latest`` still names the previous checkpoint. The first save of a run resumed from an older
checkpoint deletes the later ones it passed over (they belong to the abandoned history).

Not covered: the engines' own state (KV caches) — engines restart from ``model/``; a run resumed
with different batch sizes or mode (allowed, but no longer exact).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import msgspec
import torch

from slime.errors import CheckpointError, DiskFullError, disk_full_error
from slime.loop.resume import (
    CheckpointScan,
    LoopState,
    checkpoint_problem,
    file_label,
    first_line,
    latest_checkpoint,
    read_loop_state,
    resume_checkpoint,
    scan_checkpoints,
    step_dirs,
    step_of,
)

_log = logging.getLogger(__name__)

__all__ = [
    "LoopState",
    "CheckpointScan",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "scan_checkpoints",
    "resume_checkpoint",
    "checkpoint_problem",
    "truncate_jsonl",
    "open_run_dir",
]


def save_checkpoint(
    save_dir: str | Path, state: LoopState, *, trainer: Any, keep_last: int = 2, pinned: Path | None = None
) -> Path:
    """Write one checkpoint atomically and point ``latest`` at it; keep the newest ``keep_last``, and ``pinned``
    (the checkpoint a resumed run's engines were launched from: a restarted engine is launched from it again, so
    pruning it ended the run at the first engine restart). Returns its directory.

    Raises:
        DiskFullError: a file found no space (``ENOSPC``, ``EDQUOT``): one line naming the file, the
            disk, its free space and about how much a checkpoint needs; the partial folder is
            removed and the previous checkpoint stays ``latest``.
    """
    root = Path(save_dir)
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(".tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    name = f"step_{state.step:06d}"
    tmp = root / f".tmp-{name}"
    try:
        _write_files(tmp, state, trainer)
        final = _publish(root, tmp, name)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # frees what the partial checkpoint took
        full = disk_full_error(
            exc, what=f"checkpoint step {state.step}", path=tmp, needed_bytes=_needed_bytes(root, trainer)
        )
        if full is None:
            raise
        raise DiskFullError(f"{full}; {_previous_note(root)}") from exc
    _prune(root, name, step=state.step, keep_last=keep_last, pinned=pinned)
    return final


def load_checkpoint(path: str | Path, *, trainer: Any) -> LoopState:
    """Restore the trainer's optimizer/RNG (its weights come from ``path/model``) and return the loop state.

    Raises:
        CheckpointError: ``loop.json`` or ``trainer.pt`` unreadable, or a trainer state that does not fit
            this run's trainer (another model); one line naming the file and the step.
    """
    path = Path(path)
    state = read_loop_state(path)
    where = file_label(path, "trainer.pt")
    try:
        blob = torch.load(path / "trainer.pt", weights_only=False)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{where}: missing") from exc
    except Exception as exc:  # torch and pickle raise many kinds for a cut or garbled file
        raise CheckpointError(f"{where}: unreadable, truncated or corrupt ({first_line(exc)})") from exc
    try:
        _load_trainer_state(trainer, blob)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
        raise CheckpointError(f"{where}: does not fit this run's trainer ({first_line(exc)})") from exc
    if state.python_rng is not None:
        try:
            random.setstate(_decode_rng(state.python_rng))
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{file_label(path, 'loop.json')}: python_rng is not a random state ({first_line(exc)})"
            ) from exc
    return state


def truncate_jsonl(path: str | Path, *, max_step: int) -> None:
    """Keep the records with ``step <= max_step`` (and drop a torn last line), atomically."""
    path = Path(path)
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("step", 0) <= max_step:
            kept.append(line)
    _write_atomic(path, "".join(k + "\n" for k in kept))


def open_run_dir(
    run_dir: str | Path, load: str | None, logs: tuple[str, ...]
) -> tuple[Path, Path | None, LoopState | None]:
    """Create ``run_dir`` and find the checkpoint to resume from (``--load``), if any (``resume_checkpoint``).

    Returns ``(run_dir, checkpoint dir or None, its LoopState or None)``. The JSONL ``logs`` in
    ``run_dir`` are cut back to the checkpoint's step (all of them without one), since the steps
    after it are replayed. ``--load`` without a checkpoint logs a warning and starts fresh.

    Raises:
        CheckpointError: ``--load``'s checkpoints exist but none is complete.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = resume_checkpoint(load) if load else None
    resume = read_loop_state(ckpt) if ckpt else None
    if load and ckpt is None:
        _log.warning("--load %s: no checkpoint found; starting a fresh run", load)
    for name in logs:
        truncate_jsonl(run_dir / name, max_step=resume.step if resume else -1)
    return run_dir, ckpt, resume


def _write_files(tmp: Path, state: LoopState, trainer: Any) -> None:
    tmp.mkdir()
    trainer.save_hf(str(tmp / "model"))
    with open(tmp / "trainer.pt", "wb") as f:  # a Python file: torch's writer then chains the OSError (ENOSPC) it met
        torch.save(_trainer_state(trainer), f)
    state.python_rng = _encode_rng(random.getstate())
    (tmp / "loop.json").write_bytes(msgspec.json.encode(state))
    files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
    (tmp / "manifest.json").write_text(json.dumps({"files": files}, indent=1))
    _fsync_dir(tmp)


def _publish(root: Path, tmp: Path, name: str) -> Path:
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_atomic(root / "latest", name)
    return final


def _prune(root: Path, name: str, *, step: int, keep_last: int, pinned: Path | None) -> None:
    keep = pinned.resolve() if pinned is not None else None
    others = [p for p in step_dirs(root) if p.name != name and p.resolve() != keep]
    # after a resume from an older checkpoint, the later ones passed over would outrank this one
    newer = [p for p in others if step_of(p) > step]
    older = sorted((p for p in others if step_of(p) < step), key=step_of)
    for old in newer + older[: max(0, len(older) - (keep_last - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def _needed_bytes(root: Path, trainer: Any) -> int | None:
    """About what one checkpoint takes: the previous one's size, else the trainer's tensors (weights + optimizer state)."""
    previous = latest_checkpoint(root)
    if previous is not None:
        return sum(p.stat().st_size for p in previous.rglob("*") if p.is_file())
    try:
        model, optimizer = trainer.model.state_dict(), trainer.optimizer.state_dict()
    except Exception:  # a trainer without them: unknown
        return None
    return _tensor_bytes(model) + _tensor_bytes(optimizer)


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _previous_note(root: Path) -> str:
    previous = latest_checkpoint(root)
    if previous is None:
        return "no earlier checkpoint was written: free space, or --save on a larger disk, and start again"
    return f"the previous checkpoint {previous.name} is intact: free space, or move the run to a larger disk, and resume with --load {root.parent}"


def _trainer_state(trainer: Any) -> dict[str, Any]:
    state = {
        "optimizer": trainer.optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "policy_version": trainer.policy_version,
        "num_optimizer_steps": getattr(trainer, "num_optimizer_steps", 0),
    }
    if getattr(trainer, "critic", None) is not None:
        state["critic"] = trainer.critic.state_dict()
        state["critic_optimizer"] = trainer.critic_optimizer.state_dict()
    return state


def _load_trainer_state(trainer: Any, state: dict[str, Any]) -> None:
    if not isinstance(state, dict):
        raise TypeError(f"expected a dict of trainer state, got {type(state).__name__}")
    trainer.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    trainer.policy_version = int(state["policy_version"])
    if hasattr(trainer, "num_optimizer_steps"):  # the lr schedule's position (absent in older checkpoints: 0)
        trainer.num_optimizer_steps = int(state.get("num_optimizer_steps", 0))
    if "critic" in state and getattr(trainer, "critic", None) is not None:
        trainer.critic.load_state_dict(state["critic"])
        trainer.critic_optimizer.load_state_dict(state["critic_optimizer"])


def _encode_rng(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(data: list) -> tuple:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
