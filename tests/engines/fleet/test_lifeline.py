"""A process started through ``lifeline`` dies with the process that started it, SIGKILL included.

A small driver process starts a long sleep (through ``with_lifeline``, or as a ``CommandProcess``
the way SGLang servers are launched), prints its pid, and is killed with SIGKILL: the sleep must be
gone within seconds, not reparented to init. The embedded engine under ``slime train`` is
``tests/e2e/test_unanswered_engines.py``'s test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")

REPO = str(Path(__file__).resolve().parents[3])
DRIVER = {
    "popen": """
import subprocess, sys, time
from slime.engines.fleet.lifeline import with_lifeline
child = subprocess.Popen(with_lifeline([sys.executable, "-c", "import time; time.sleep(120)"]))
print(child.pid, flush=True)
time.sleep(120)
""",
    "command": """
import asyncio, sys
from slime.engines.fleet.processes import CommandProcess

async def main():
    async def ready(timeout_s):
        return None
    proc = CommandProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"], env={}, url="http://x", ready=ready)
    await proc.start(10)
    print(proc.pid, flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
""",
}


def _alive(pid: int) -> bool:
    """Running (a zombie, waiting for its reaper, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.parametrize("how", sorted(DRIVER))
def test_a_process_started_through_the_lifeline_dies_when_its_starter_is_killed_with_sigkill(how):
    env = {**os.environ, "PYTHONPATH": REPO}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER[how]], env=env, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert driver.stdout is not None
        child = int(driver.stdout.readline())
        assert _alive(child)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"pid {child} outlived its killed starter"
    finally:
        driver.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_command_keeps_the_pid_it_was_started_with():
    from slime.engines.fleet.lifeline import with_lifeline

    proc = subprocess.run(
        with_lifeline(["sh", "-c", "echo $$ $PPID"]),
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
    )
    pid, ppid = map(int, proc.stdout.split())
    assert ppid == os.getpid() and proc.returncode == 0  # exec'd in place: our child, not a grandchild
    assert pid != os.getpid()


def test_a_lifeline_whose_starter_is_already_gone_does_not_run_the_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO}
    lifeline = [sys.executable, "-m", "slime.engines.fleet.lifeline"]
    gone = subprocess.run([*lifeline, "1", "--", "touch", str(tmp_path / "a")], env=env, capture_output=True, text=True)
    assert gone.returncode == 1 and gone.stderr == "" and not (tmp_path / "a").exists()  # its parent is us, not pid 1
    ours = subprocess.run(
        [*lifeline, str(os.getpid()), "--", "touch", str(tmp_path / "b")], env=env, capture_output=True, text=True
    )
    assert ours.returncode == 0 and (tmp_path / "b").exists()
