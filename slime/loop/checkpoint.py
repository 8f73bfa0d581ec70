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
    SAVE/latest             the name of the newest complete checkpoint (replaced atomically)

Atomicity: a checkpoint is written into ``.tmp-step_N`` and renamed to ``step_N`` only when
complete; ``latest`` is then replaced by rename. A ``kill -9`` at any moment leaves either the
previous checkpoint or the new one as ``latest``, never a torn one. Leftover ``.tmp-*`` folders are
removed at the next save. On resume the metrics and trained-group logs are cut back to the
checkpoint's step, so the steps replayed after it are not counted twice.

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

from slime.types import Group

_log = logging.getLogger(__name__)

__all__ = ["LoopState", "save_checkpoint", "load_checkpoint", "latest_checkpoint", "truncate_jsonl", "open_run_dir"]


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


def save_checkpoint(save_dir: str | Path, state: LoopState, *, trainer: Any, keep_last: int = 2) -> Path:
    """Write one checkpoint atomically and point ``latest`` at it. Returns its directory."""
    root = Path(save_dir)
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(".tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    name = f"step_{state.step:06d}"
    tmp = root / f".tmp-{name}"
    tmp.mkdir()
    trainer.save_hf(str(tmp / "model"))
    torch.save(_trainer_state(trainer), tmp / "trainer.pt")
    state.python_rng = _encode_rng(random.getstate())
    (tmp / "loop.json").write_bytes(msgspec.json.encode(state))
    _fsync_dir(tmp)
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_atomic(root / "latest", name)
    for old in sorted(p for p in root.glob("step_*") if p.name != name)[: -max(0, keep_last - 1) or None]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(save_dir: str | Path) -> Path | None:
    root = Path(save_dir)
    latest = root / "latest"
    if not latest.is_file():
        return None
    path = root / latest.read_text().strip()
    return path if (path / "loop.json").is_file() else None


def load_checkpoint(path: str | Path, *, trainer: Any) -> LoopState:
    """Restore the trainer's optimizer/RNG (its weights come from ``path/model``) and return the loop state."""
    path = Path(path)
    state = msgspec.json.decode((path / "loop.json").read_bytes(), type=LoopState)
    _load_trainer_state(trainer, torch.load(path / "trainer.pt", weights_only=False))
    if state.python_rng is not None:
        random.setstate(_decode_rng(state.python_rng))
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


def open_run_dir(run_dir: str | Path, load: str | None, logs: tuple[str, ...]) -> tuple[Path, Path | None, LoopState | None]:
    """Create ``run_dir`` and find the checkpoint to resume from (``--load``), if any.

    Returns ``(run_dir, checkpoint dir or None, its LoopState or None)``. The JSONL ``logs`` in
    ``run_dir`` are cut back to the checkpoint's step (all of them without one), since the steps
    after it are replayed. ``--load`` without a checkpoint logs a warning and starts fresh.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = latest_checkpoint(Path(load) / "checkpoints") if load else None
    resume = msgspec.json.decode((ckpt / "loop.json").read_bytes(), type=LoopState) if ckpt else None
    if load and ckpt is None:
        _log.warning("--load %s: no checkpoint found; starting a fresh run", load)
    for name in logs:
        truncate_jsonl(run_dir / name, max_step=resume.step if resume else -1)
    return run_dir, ckpt, resume


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
