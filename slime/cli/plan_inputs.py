"""The input checks of a plan (``slime train --dry-run``, and ``--ray --dry-run``): a launch script written for
a cluster names paths of that cluster (``--hf-checkpoint /root/Qwen3-4B``), which this machine may not have.

``check_plan_inputs`` runs ``check_inputs`` on every path that is here and returns one note line naming each
input path that is not (``missing_input_paths``), so the plan is still printed; a real run refuses those
paths (``preflight``), and a path that is here but broken is an error in a plan too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slime.config import Config

__all__ = ["missing_input_paths", "check_plan_inputs"]


def _input_paths(config: Config) -> list[tuple[str, str | None]]:
    """``(flag, path)`` of every file or directory the run reads at start (None: not given)."""
    d, e = config.data, config.engine
    return [
        ("--hf-checkpoint", e.hf_checkpoint),
        ("--ref-load", config.train.ref_load),
        ("--opd-teacher-load", e.opd_teacher_load),
        ("--prompt-data", d.prompt_data),
        *(("--eval-prompt-data", path) for _, path in d.eval_datasets),
        ("--offline-data", d.offline_data),
        ("--load-debug-rollout-data", config.debug.load_debug_rollout_data),
    ]


def missing_input_paths(config: Config) -> list[tuple[str, str]]:
    """``(flag, path)`` of each input path given that does not exist on this machine, in flag order."""
    return [(flag, path) for flag, path in _input_paths(config) if path and not Path(path).exists()]


def check_plan_inputs(config: Config) -> str | None:
    """``check_inputs`` (rows parsed) on the inputs that exist here; the note line naming the ones that do not.

    Returns:
        ``note: not on this machine, planned anyway (a real run refuses them): --hf-checkpoint /root/Qwen3-4B,
        ...``, or None when every input path is here.

    Raises:
        ConfigError, CheckpointError, DataError: as ``check_inputs``, for the inputs that are here.
    """
    from slime.cli.preflight import check_inputs

    missing = missing_input_paths(config)
    check_inputs(config, parse_data=True, absent=frozenset(path for _, path in missing))
    if not missing:
        return None
    named = ", ".join(f"{flag} {path}" for flag, path in missing)
    return f"note: not on this machine, planned anyway (a real run refuses them): {named}"
