"""The run folder of a ``slime train`` run without ``--save``: a new ``runs/<YYYYmmdd-HHMMSS>`` per run, with
``runs/latest`` a symlink to the newest (``slime.loop.run.fresh_run_dir`` / ``point_latest``), so a second
run without ``--save`` starts instead of being refused, and ``--load runs/latest`` names the last one.
A run with ``--save DIR`` writes to DIR and leaves ``runs/latest`` alone; so does a ``--load`` without
``--save`` (its run folder is resolved by the resume code).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from slime.config import Config

__all__ = ["name_run_folder", "link_latest", "default_run_dir"]

log = logging.getLogger("slime.cli")


def default_run_dir(config: Config) -> str:
    """``Config.run_dir``'s default (``runs/latest``): the link to the newest run without ``--save``."""
    return str(next(f.default for f in msgspec.structs.fields(config) if f.name == "run_dir"))


def name_run_folder(config: Config) -> tuple[Config, bool]:
    """``config`` with a new ``runs/<time>`` run folder when it has neither ``--save`` nor ``--load``, and True;
    else ``config`` as it is and False."""
    from slime.loop.run import fresh_run_dir

    if config.run_dir != default_run_dir(config) or config.load:
        return config, False
    return msgspec.structs.replace(config, run_dir=fresh_run_dir(config.run_dir)), True


def link_latest(config: Config) -> None:
    """On rank 0, point ``runs/latest`` at the run folder ``name_run_folder`` named (one line when a real folder of
    an older slime's run is in the way, left as it is)."""
    from slime.loop.run import point_latest

    latest = default_run_dir(config)
    if int(os.environ.get("RANK", "0")) == 0 and not point_latest(latest, config.run_dir):
        log.info(
            "%s is a folder (a run of an older slime), not a link: this run's folder is %s", latest, config.run_dir
        )
