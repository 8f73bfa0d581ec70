"""``--load RUN_DIR``: the saved run's configuration, and the flags that may change on resume.

``slime train --load RUN_DIR`` alone continues that run as it was: its ``RUN_DIR/config.json`` (the whole
config: data, reward, batch, eval, model, mode, ...) is the base, and without ``--save`` the run writes into
``RUN_DIR``. The flags given on top may change only what leaves the run's result alone (``RESUMABLE``: its length,
the save and eval cadence, logging, timeouts, where and how the engines and trainer run); any other flag must
repeat the saved value, else it is an error naming the flag, both values and the file. A ``--load`` folder
without a ``config.json`` (a fresh run's ``--load``, as THUDM/slime's scripts pass it) takes the flags alone.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from slime.errors import ConfigError

if TYPE_CHECKING:
    from slime.config import Config

__all__ = ["RESUMABLE", "resumable_flags", "config_on_load", "saved_config", "check_resume_flags"]

log = logging.getLogger("slime.cli")

RESUMABLE = (
    "run_dir",
    "load",
    "save_interval",
    "loop.num_rollout",
    "loop.eval_interval",
    "loop.abort_timeout_s",
    "obs.",
    "rollout.request_timeout_s",
    "rollout.control_timeout_s",
    "rollout.max_retries",
    "rollout.retry_backoff_s",
    "rollout.reward_timeout_s",
    "engine.rollout_external_engine_addrs",
    "engine.num_engines",
    "engine.max_running_requests",
    "engine.engine_threads",
    "engine.startup_timeout_s",
    "engine.rollout_num_gpus",
    "engine.sglang_args",
    "engine.router_args",
    "engine.sglang_router_",
    "engine.base_port",
    "engine.health_check_",
    "engine.circuit_breaker_",
    "engine.max_engine_restarts",
    "engine.ray_placed_engines",
    "sync.",
    "train.num_threads",
    "train.device",
    "train.actor_num_",
    "train.megatron.recompute_",
    "train.megatron.distributed_timeout_minutes",
    "debug.save_debug_rollout_data",
)
"""Config paths (or path prefixes, ending in ``.`` or ``_``) that a flag may change on resume."""


def _resumable(path: str) -> bool:
    return any(path == p or (p[-1] in "._" and path.startswith(p)) for p in RESUMABLE)


def resumable_flags() -> list[str]:
    """The flags that may change on resume (``--num-rollout``, ``--save``, ...), in the flag table's order."""
    from slime.cli.flags import FLAGS

    return [flag for flag, (path, _) in FLAGS.items() if _resumable(path.split("=", 1)[0])]


def config_on_load(ns: argparse.Namespace, of_flags: Callable[[Config | None], Config]) -> Config:
    """The run's config: ``of_flags(None)`` (the flags alone), or with ``--load`` of a run that saved a config,
    ``of_flags(that config, its folder as --save)`` checked against it (``check_resume_flags``).

    Raises:
        ConfigError: an unreadable saved config, or a flag that contradicts it.
    """
    saved = saved_config(ns.load) if getattr(ns, "load", None) else None
    if saved is None:
        return of_flags(None)
    config = of_flags(msgspec.structs.replace(saved, run_dir=ns.load, load=ns.load))
    check_resume_flags(saved, config, ns, load=ns.load)
    return config


def saved_config(load: str) -> Config | None:
    """``LOAD/config.json`` as a ``Config``, or None when there is none (nothing was run there yet).

    Raises:
        ConfigError: a ``config.json`` that is unreadable or not a config of this slime, naming the file.
    """
    from slime.config import Config

    path = Path(load) / "config.json"
    if not path.is_file():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=Config)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"--load {load}: {path} is not a run configuration of this slime ({exc})") from None


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"loop.rollout_batch_size": 32, ...}``: every leaf of a config tree (lists are leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else key))
    return out


def _flag_of(path: str, ns: argparse.Namespace) -> str:
    """The flag given for ``path`` (``--rollout-batch-size``), else the first flag of it, else the path itself."""
    from slime.cli.flags import FLAGS

    flags = [flag for flag, (p, _) in FLAGS.items() if p.split("=", 1)[0] == path]
    given = [f for f in flags if getattr(ns, f[2:].replace("-", "_"), None) not in (None, False)]
    return (given or flags or [path])[0]


def check_resume_flags(saved: Config, config: Config, ns: argparse.Namespace, *, load: str) -> None:
    """Refuse a flag that contradicts the saved run: ``config`` (the saved run with the flags on top) may differ
    from ``saved`` only at ``RESUMABLE`` paths; one INFO line names the ones that changed.

    Raises:
        ConfigError: every contradicting flag with its value and the saved one, the file, and what may change.
    """
    before, after = _leaves(msgspec.to_builtins(saved)), _leaves(msgspec.to_builtins(config))
    changed = [path for path in after if before.get(path) != after[path]]
    bad = [path for path in changed if not _resumable(path)]
    if bad:
        said = "; ".join(f"{_flag_of(p, ns)} {after[p]!r} (saved: {p} = {before.get(p)!r})" for p in bad)
        raise ConfigError(
            f"--load {load}: contradicts the saved run ({Path(load) / 'config.json'}): {said}. On resume only these "
            f"may change: {', '.join(resumable_flags())} (docs/slime_flags.md); start a new run with another --save "
            "to change the others"
        )
    log.info(
        "--load %s: the saved run's configuration (%s)%s",
        load,
        Path(load) / "config.json",
        "".join(
            f"; {_flag_of(p, ns)} {before.get(p)!r} -> {after[p]!r}" for p in changed if p not in ("run_dir", "load")
        ),
    )
