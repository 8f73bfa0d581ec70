"""What a bench run records about where and when it ran: date, machine, command, commit, load."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

from slime.types import JsonObject

__all__ = ["run_meta", "git_state", "loadavg"]


def run_meta(engine_urls: list[str] | None) -> JsonObject:
    """The machine, date, command and commit a bench run records (``results["meta"]``)."""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": loadavg(),
        "argv": sys.argv,
        "git": git_state(),
        "engine_urls": engine_urls,
    }


def git_state() -> str | None:
    """``<HEAD sha>`` plus ``+N files modified`` when the working tree differs (None outside a checkout)."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head} +{len(dirty)} files modified or untracked" if dirty else head or None


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
