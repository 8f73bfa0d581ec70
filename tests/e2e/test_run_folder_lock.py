"""One run per run folder, end to end (issue 26 item 3): real ``slime train`` SFT runs on one ``--save``.

Run A is a separate process that stops itself just before writing one step's metrics
(``tests.fixtures.paused_run``), so it is live for as long as the test needs, with no timing. While it
is live, a second run on its folder, fresh or ``--load``, is refused with one line naming A's pid,
host and start, and writes nothing there; A then finishes with every step once, and a later
``--load`` continues it with nothing lost or repeated. When A is killed (``kill -9``), the next
``--load`` takes its lock over with a log line naming it and resumes from A's last checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime.cli import main
from tests.fixtures.sft_run import sft_argv, step_numbers, trained_rows, write_sft_inputs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    return write_sft_inputs(tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> list[tuple[int, list[int]]]:
    """The rows an uninterrupted 8-step run trains, step by step (its first 6 steps: a 6-step run's)."""
    run = tmp_path_factory.mktemp("ref") / "run"
    assert main(sft_argv(*inputs, run, steps=8)) == 0
    return trained_rows(run)


def _start_paused(argv: list[str], pause_at: int, log: Path) -> subprocess.Popen:
    """Run A: ``slime ARGV`` in a new process, stopped before its step ``pause_at`` record is written."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.paused_run", str(pause_at), *argv], cwd=ROOT, stdout=out, stderr=out
        )
    deadline = time.monotonic() + 120  # a bound on start-up (imports, model load), not a measured time
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run A ended (rc {proc.returncode}) before pausing:\n{log.read_text()}")
        if Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"run A did not reach step {pause_at}:\n{log.read_text()}")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused_line(capsys, argv: list[str], holder: subprocess.Popen) -> str:
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, f"a second run on a live run folder was not refused (rc {rc}):\n{err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"is in use by another live run (pid {holder.pid} on host {socket.gethostname()}, started " in lines[0], (
        lines[0]
    )
    return lines[0]


@pytest.mark.parametrize("pause_at", [1, 4], ids=["before any step is logged", "after a checkpoint"])
def test_a_second_run_on_a_live_run_folder_is_refused_and_the_live_run_loses_nothing(
    inputs, reference, tmp_path, capsys, pause_at
):
    run = tmp_path / "run"
    a = _start_paused(sft_argv(*inputs, run), pause_at, tmp_path / "a.log")
    try:
        before = _files(run)
        _refused_line(capsys, sft_argv(*inputs, run), a)  # a fresh run at the same time
        _refused_line(capsys, sft_argv(*inputs, run, "--load", str(run)), a)  # a resume of the live run
        assert _files(run) == before, "a refused run wrote into the live run's folder"
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(timeout=120) == 0, (tmp_path / "a.log").read_text()
    finally:
        a.kill()
    assert "done: SFT 6 steps" in (tmp_path / "a.log").read_text()
    assert step_numbers(run) == [1, 2, 3, 4, 5, 6] and trained_rows(run) == reference[:6]
    assert main(sft_argv(*inputs, run, "--load", str(run), steps=8)) == 0  # A's folder is free again once A ended
    assert step_numbers(run) == list(range(1, 9)) and trained_rows(run) == reference


def test_the_lock_of_a_killed_run_is_taken_over_with_a_line_and_its_checkpoint_is_resumed(
    inputs, reference, tmp_path, caplog
):
    run = tmp_path / "run"
    a = _start_paused(sft_argv(*inputs, run), 4, tmp_path / "a.log")  # steps 1-3 logged, checkpoint step 2 written
    os.kill(a.pid, signal.SIGKILL)
    a.wait(timeout=60)
    caplog.set_level(logging.INFO)
    assert main(sft_argv(*inputs, run, "--load", str(run))) == 0
    taken = [r.getMessage() for r in caplog.records if "taking over its lock" in r.getMessage()]
    assert len(taken) == 1 and f"no longer live (pid {a.pid} on host {socket.gethostname()}, started " in taken[0], (
        taken
    )
    assert any(f"resuming from {run / 'checkpoints' / 'step_000002'}" in r.getMessage() for r in caplog.records)
    assert (
        step_numbers(run) == [1, 2, 3, 4, 5, 6] and trained_rows(run) == reference[:6]
    )  # step 3 replayed once, nothing lost
