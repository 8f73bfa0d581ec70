"""The run folder of a ``slime train`` run without ``--save``: a new ``runs/<YYYYmmdd-HHMMSS>`` per run, with
``runs/latest`` a symlink to the newest (``slime.loop.run.fresh_run_dir`` / ``point_latest``), so a second
run without ``--save`` starts instead of being refused, and ``--load runs/latest`` names the last one.
A run with ``--save DIR`` writes to DIR and leaves ``runs/latest`` alone; so does a ``--load`` without
``--save`` (its run folder is resolved by the resume code).
"""

from __future__ import annotations

import logging
import os

import msgspec

__all__ = ["fresh_run_folder", "link_latest", "default_run_dir"]

log = logging.getLogger("slime.cli")


def default_run_dir() -> str:
    """``Config.run_dir``'s default (``runs/latest``): the link to the newest run without ``--save``."""
    from slime.config import Config

    return str(next(f.default for f in msgspec.structs.fields(Config) if f.name == "run_dir"))


def fresh_run_folder(run_dir: str, *, load: str | None) -> str | None:
    """A new ``runs/<time>`` folder for a run with neither ``--save`` (``run_dir`` is the default) nor ``--load``;
    None for any other run (its folder is the one given)."""
    from slime.loop.run import fresh_run_dir

    if run_dir != default_run_dir() or load:
        return None
    return fresh_run_dir(run_dir)


def link_latest(run_dir: str) -> None:
    """On rank 0, point ``runs/latest`` at ``run_dir`` (one line when a real folder of an older slime's run is in the
    way, left as it is)."""
    from slime.loop.run import point_latest

    latest = default_run_dir()
    if int(os.environ.get("RANK", "0")) == 0 and not point_latest(latest, run_dir):
        log.info("%s is a folder (a run of an older slime), not a link: this run's folder is %s", latest, run_dir)
