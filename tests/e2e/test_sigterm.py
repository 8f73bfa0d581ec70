"""SIGTERM honoured in every phase of a real ``slime train`` (issue 26 item 6): startup, data loading, eval and
rollout each end within a bound with one line (exit status 130, no traceback, no engine left behind).

Each test starts ``slime train`` on the shipped arith warm start (CPU, one embedded engine) with a plugin that
says, by writing a marker file, that the run reached the phase under test, and sends SIGTERM then. The bounds
are generous (several times what the stop takes), never what a phase would take without honouring it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = str(Path(__file__).resolve().parents[2])
TINY = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4"]
TINY += ["--rollout-max-response-len", "8", "--num-eval-prompts", "4", "--no-progress", "--reward-timeout-s", "3000"]

PLUGIN = '''
import asyncio, os, pathlib, time

MARK = pathlib.Path(os.environ["SIGTERM_TEST_MARK"])
if os.environ.get("SIGTERM_TEST_SLOW_IMPORT"):  # startup: check_inputs imports the reward's module
    MARK.write_text("importing")
    time.sleep(600)


async def hang(sample):
    """Awaits for good: the phase that calls it waits on it (not the start-of-run probe: slime.cli.check_plugins)."""
    if sample.metadata.get("plugin_probe"):
        return 0.0
    MARK.write_text("reward")
    await asyncio.sleep(3600)
    return 0.0


async def block(sample):
    """Blocks the event loop's thread (sync code in an async reward): only the watchdog can end the run."""
    if sample.metadata.get("plugin_probe"):
        return 0.0
    MARK.write_text("reward")
    time.sleep(600)
    return 0.0
'''


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    (tmp_path / "sigplug.py").write_text(PLUGIN)
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), REPO]),
        "SIGTERM_TEST_MARK": str(tmp_path / "mark"),
        **(env or {}),
    }
    argv = [sys.executable, "-m", "slime.cli", "train", "--save", str(tmp_path / "run"), *TINY, *args]
    return subprocess.Popen(argv, env=full_env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"slime train ended before {path.name}: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"slime train never reached {path.name}"
        time.sleep(0.05)


def _terminate(proc: subprocess.Popen, bound_s: float) -> tuple[str, list[psutil.Process]]:
    """SIGTERM, then wait at most ``bound_s`` for the exit; returns stderr's last line and the children it had."""
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        for child in children:
            child.kill()
        pytest.fail(f"slime train was still running {bound_s}s after SIGTERM")
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err, err[-3000:]
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {alive}"
    return err.strip().splitlines()[-1], children


def test_sigterm_during_startup_ends_it_with_one_line(tmp_path):
    proc = _start(tmp_path, "--custom-rm-path", "sigplug.hang", env={"SIGTERM_TEST_SLOW_IMPORT": "1"})
    _wait_for(tmp_path / "mark", proc)
    line, _ = _terminate(proc, bound_s=10)
    assert line == "slime train: interrupted (SIGTERM during startup) before the run started"
    assert not (tmp_path / "run").exists()


def test_sigterm_while_a_large_prompt_file_loads_stops_the_load(tmp_path):
    """180k rows of 120 characters, each measured against the model's 128-token context: a load of many
    seconds on one core. The reading thread stops at the request instead of finishing the file."""
    prompts = tmp_path / "prompts.jsonl"
    row = '{"prompt": "' + "1+2=3 " * 20 + '", "label": "3"}\n'
    prompts.write_text(row * 180_000)
    proc = _start(tmp_path, "--prompt-data", str(prompts), "--rm-type", "arith", env={"SLIME_SIGTERM_GRACE_S": "600"})
    _wait_for(tmp_path / "run" / "config.json", proc)
    time.sleep(1.0)  # the tokenizer and the model config load, then the prompts
    line, _ = _terminate(proc, bound_s=10)  # without the request the load goes on for its whole length
    assert line.startswith("slime train: interrupted (SIGTERM") and line.endswith(
        f"run directory {tmp_path / 'run'}"
    ), line


def test_sigterm_during_the_eval_with_its_loop_blocked_ends_it_at_the_grace(tmp_path):
    proc = _start(tmp_path, "--custom-rm-path", "sigplug.block", env={"SLIME_SIGTERM_GRACE_S": "1"})
    _wait_for(tmp_path / "mark", proc)  # the eval before the first step calls the reward
    line, children = _terminate(proc, bound_s=15)
    assert (
        line
        == f"slime train: interrupted (SIGTERM); run directory {tmp_path / 'run'} (it did not stop within 1s of SIGTERM)"
    )
    assert children  # the embedded engine, gone with the run


def test_sigterm_during_a_rollout_step_ends_it_with_one_line(tmp_path):
    proc = _start(tmp_path, "--custom-rm-path", "sigplug.hang", "--skip-eval-before-train", "--num-rollout", "3")
    _wait_for(tmp_path / "mark", proc)  # step 1's first sample is being rewarded
    line, children = _terminate(proc, bound_s=15)
    assert line == f"slime train: interrupted (SIGTERM); run directory {tmp_path / 'run'}"
    assert children
