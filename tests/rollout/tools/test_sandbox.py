"""The sandbox blocks network, writes outside its directory, fork bombs, memory hogs and endless loops.

Each run starts a fresh bubblewrap sandbox with ``python -I -S`` in it (about 30 ms); limits are set
small so each test finishes well under 3 s. Without a working bwrap they are skipped (the refusal
and the unsafe mode are tested here and in ``test_sandbox_escapes.py``).
"""

from __future__ import annotations

import time

import pytest

from slime.rollout.tools.registry import ToolRegistry
from slime.rollout.tools.sandbox import Sandbox, process_limit_enforced, python_tool, sandbox_unavailable_reason

requires_bwrap = pytest.mark.skipif(
    sandbox_unavailable_reason() is not None, reason=f"no OS sandbox: {sandbox_unavailable_reason()}"
)


@pytest.fixture
def sandbox():
    return Sandbox(timeout_s=1.5, memory_bytes=256 << 20, max_output_bytes=4096)


@requires_bwrap
async def test_stdin_and_stdout_round_trip(sandbox):
    result = await sandbox.run("print(input()[::-1])", stdin="abc\n")
    assert result.ok and result.stdout == "cba\n"


@requires_bwrap
async def test_network_access_is_blocked(sandbox):
    code = "import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=0.5)\nprint('connected')"
    result = await sandbox.run(code)
    assert not result.ok and "connected" not in result.stdout
    assert "unreachable" in result.stderr and result.network == "netns"


@pytest.mark.parametrize("network_namespace", [True, False])
async def test_unsafe_mode_still_blocks_network(network_namespace, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap: the audit-hook fallback
    box = Sandbox(timeout_s=1.5, network_namespace=network_namespace, allow_unsafe=True)
    code = "import socket\ns = socket.create_connection(('127.0.0.1', 9), timeout=0.5)\nprint('connected')"
    result = await box.run(code)
    assert box.isolation == "unsafe" and not result.ok and "connected" not in result.stdout
    assert "socket" in result.stderr or "unreachable" in result.stderr
    if not network_namespace:
        assert result.network == "audit-hook" and "sandbox: socket" in result.stderr


@requires_bwrap
async def test_writes_outside_the_working_directory_are_denied(sandbox, tmp_path):
    target = tmp_path / "escaped.txt"
    code = f"open('inside.txt', 'w').write('ok')\nopen({str(target)!r}, 'w').write('escaped')"
    result = await sandbox.run(code)
    assert not result.ok and "FileNotFoundError" in result.stderr  # the host's tmp_path is not in the sandbox's view
    assert not target.exists()


@requires_bwrap
async def test_fork_bomb_is_stopped():
    if not process_limit_enforced():  # only the wall-clock kill would stop it, after loading the machine
        pytest.skip("RLIMIT_NPROC does not bind here (the sandbox runs as the host's root)")
    t0 = time.monotonic()
    result = await Sandbox(timeout_s=1.5).run("import os\nwhile True:\n    os.fork()")
    assert not result.ok and not result.timed_out and "BlockingIOError" in result.stderr
    assert time.monotonic() - t0 < 3


@requires_bwrap
async def test_memory_hog_fails_with_memory_error(sandbox):
    result = await sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(32 << 20))")
    assert not result.ok and result.memory_exceeded and not result.timed_out


@requires_bwrap
async def test_infinite_loop_is_killed_at_the_wall_clock_limit():
    t0 = time.monotonic()
    result = await Sandbox(timeout_s=0.5).run("while True:\n    pass")
    assert result.timed_out and result.returncode is not None and result.returncode < 0
    assert time.monotonic() - t0 < 2


@requires_bwrap
async def test_output_flood_is_capped_and_killed(sandbox):
    # killed once stdout passes the cap, not read and discarded until the time limit
    result = await Sandbox(timeout_s=30.0, max_output_bytes=1000).run("while True:\n    print('x' * 10000)")
    assert result.truncated and len(result.stdout) == 1000 and not result.timed_out and not result.ok
    assert result.elapsed_s < 30.0


@requires_bwrap
async def test_a_flood_on_stderr_is_capped_and_the_run_goes_on(sandbox):
    code = "import sys\nfor _ in range(200):\n    sys.stderr.write('e' * 10000)\nprint('answer')"
    result = await Sandbox(timeout_s=30.0, max_output_bytes=1000).run(code)
    assert result.ok and result.stdout == "answer\n" and result.truncated and len(result.stderr) <= 1000


@requires_bwrap
async def test_python_tool_reports_the_error_to_the_model(sandbox):
    reg = ToolRegistry([python_tool(sandbox)])
    ok = await reg.call("python", {"code": "print(sum(range(10)))"})
    bad = await reg.call("python", {"code": "1/0"})
    assert ok.content == "45"
    assert "[exit status 1]" in bad.content and "ZeroDivisionError" in bad.content
