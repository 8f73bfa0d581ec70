"""Escape attempts from model-written code (issue 14, item 15): each must be stopped by the OS sandbox.

The in-process audit hook that came before let every one of these through: ``_posixsubprocess.fork_exec``
is not audited, a child it starts has no hook at all, and ``/proc`` showed the parent. Each test runs
one small program in a fresh bubblewrap sandbox (about 50 ms); they are skipped where bwrap cannot
run, and ``test_without_bwrap_code_execution_refuses_unless_allowed`` covers that case.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest

from slime.errors import ConfigError
from slime.rollout.tools import sandbox as sandbox_mod
from slime.rollout.tools.sandbox import Sandbox, SandboxUnavailable, sandbox_unavailable_reason

requires_bwrap = pytest.mark.skipif(
    sandbox_unavailable_reason() is not None, reason=f"no OS sandbox: {sandbox_unavailable_reason()}"
)

# fork_exec as subprocess calls it (with allow_vfork since 3.11.?, 3.12): it raises no audit event.
FORK_EXEC = """
import _posixsubprocess, os, sys
def spawn(argv):
    args = [[a.encode() for a in argv], [argv[0].encode()], True, (), None, None, -1, -1, -1, -1, -1, -1,
            *os.pipe(), False, True, -1, None, None, None, -1, None]
    try:
        return _posixsubprocess.fork_exec(*args, False)
    except TypeError:
        return _posixsubprocess.fork_exec(*args)
"""


@pytest.fixture
def box():
    return Sandbox(timeout_s=3.0, memory_bytes=256 << 20, max_output_bytes=8192)


def _processes_with(marker: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


@requires_bwrap
async def test_fork_exec_shell_cannot_write_outside_or_leave_processes(box, tmp_path):
    target = tmp_path / "escaped.txt"
    marker = f"31.{os.getpid()}{time.monotonic_ns() % 100000}"
    code = (
        FORK_EXEC
        + f"""
spawn(["/bin/sh", "-c", "echo escaped > {target}; sleep {marker} & sleep {marker} &"])
import time; time.sleep(0.3)
print("spawned")
"""
    )
    try:
        result = await box.run(code)
        time.sleep(0.2)  # the sandbox's PID namespace is torn down when its init exits
        assert not target.exists()
        assert _processes_with(f"sleep\x00{marker}") == []
        assert "spawned" in result.stdout  # fork_exec itself may run: the OS, not a hook, is the boundary
    finally:
        for pid in _processes_with(f"sleep\x00{marker}"):
            os.kill(pid, 9)


@requires_bwrap
async def test_writes_go_nowhere_but_the_working_directory(box, tmp_path):
    outside = [tmp_path / "a.txt", os.path.join(sys.base_prefix, "slime-escape.txt"), "/usr/slime-escape.txt"]
    code = "import subprocess\nopen('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
    for path in outside:
        code += f"try:\n    open({str(path)!r}, 'w').write('x')\nexcept OSError as e:\n    print('denied', type(e).__name__)\n"
        code += f"subprocess.run(['/bin/sh', '-c', 'echo x > {path}'], stderr=subprocess.DEVNULL)\n"
    try:
        result = await box.run(code)
        assert result.stdout.startswith("ok\n") and result.stdout.count("denied") == len(outside), result.stderr
        assert not any(os.path.exists(p) for p in outside)
    finally:
        for p in outside:
            if os.path.exists(p):
                os.remove(p)


@requires_bwrap
async def test_no_network_even_from_a_child_process(box):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = (
        FORK_EXEC
        + f"""
import socket
for host in ("127.0.0.1", "1.1.1.1"):
    try:
        socket.create_connection((host, {port}), timeout=0.5)
        print("connected", host)
    except OSError as e:
        print("refused", host, type(e).__name__)
spawn(["{sys.executable}", "-c", "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=0.5)"])
import time; time.sleep(0.5)
"""
    )
    try:
        result = await box.run(code)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
        assert "connected" not in result.stdout and result.stdout.count("refused") == 2, result.stdout + result.stderr
    finally:
        server.close()


@requires_bwrap
async def test_parent_environment_and_files_are_invisible(box, tmp_path, monkeypatch):
    monkeypatch.setenv("SLIME_SANDBOX_TEST_SECRET", "hunter2-secret")
    secret_file = tmp_path / "credentials"
    secret_file.write_text("hunter2-file")
    # The program reports only whether it saw the secret, so a failing run cannot print the host's environment.
    code = f"""
import os
seen = ['env'] if 'hunter2' in repr(dict(os.environ)) else []
for pid in [{os.getpid()}, {os.getppid()}] + [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        if b'hunter2' in open(f'/proc/{{pid}}/environ', 'rb').read():
            seen.append(f'/proc/{{pid}}/environ')
    except OSError:
        pass
for path in [{str(secret_file)!r}, '/etc/shadow', '/root/.bash_history']:
    try:
        open(path).read()
        seen.append(path)
    except OSError:
        pass
print('seen:', seen)
"""
    result = await box.run(code)
    assert result.ok, result.stderr
    assert result.stdout == "seen: []\n"


@requires_bwrap
async def test_pid_namespace_hides_the_host_processes(box):
    result = await box.run("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert result.ok and max(eval(result.stdout)) < 10, result.stdout


@requires_bwrap
async def test_process_count_is_limited(box):
    if not sandbox_mod.process_limit_enforced():
        pytest.skip("RLIMIT_NPROC does not bind here (the sandbox runs as the host's root)")
    code = "import os, time\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n            time.sleep(5)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped', n, type(e).__name__)\n"
    result = await box.run(code)
    assert result.stdout.startswith("stopped") and int(result.stdout.split()[1]) < box.max_processes, (
        result.stdout + result.stderr
    )


async def test_without_bwrap_code_execution_refuses_unless_allowed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    assert "not found" in sandbox_unavailable_reason()
    with pytest.raises(SandboxUnavailable) as info:
        Sandbox()
    message = str(info.value)
    assert isinstance(info.value, ConfigError) and "\n" not in message
    assert "--allow-unsafe-code-execution" in message and "apt-get install bubblewrap" in message
    unsafe = Sandbox(timeout_s=2.0, allow_unsafe=True)
    assert unsafe.isolation == "unsafe"
    assert (await unsafe.run("print(6 * 7)")).stdout == "42\n"


def test_a_bwrap_that_cannot_create_namespaces_is_refused_with_its_reason(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"  # what bwrap prints where unprivileged user namespaces are off
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        SandboxUnavailable, match="cannot start a sandbox here \\(bwrap: No permissions to creating new namespace\\)"
    ):
        Sandbox()
