"""Run untrusted Python in a child process with resource limits: defence in depth, NOT a security boundary.

What a run does (``Sandbox.run(code, stdin=...)``):

1. A fresh temporary directory becomes the child's working directory, ``HOME`` and ``TMPDIR``;
   it is deleted afterwards.
2. The child is ``python -I -S`` (isolated mode, no ``site``: only the standard library, no
   ``PYTHON*`` variables, no user site) in a new session (its own process group), started with a
   minimal environment. A bootstrap script (``_BOOTSTRAP``) runs first, in the child:
   - ``resource.setrlimit`` (soft = hard, so the code cannot raise them): CPU seconds, address
     space, file size, open files, core size 0, and ``RLIMIT_NPROC``. Limits are set here rather
     than in ``preexec_fn``, which the Python docs call unsafe in a process with threads (ours has
     them: torch, ``asyncio.to_thread``).
   - no network: ``unshare(CLONE_NEWNET)`` through libc (a new network namespace with only a
     down loopback) when the kernel permits it (root, or unprivileged user namespaces, tried as
     ``CLONE_NEWUSER | CLONE_NEWNET``); ``SandboxResult.network`` says which held.
   - an audit hook (``sys.addaudithook``, PEP 578), installed after that, denying: every
     ``socket.*`` event; process creation (``os.fork``, ``os.system``, ``os.exec``,
     ``os.posix_spawn``, ``os.spawn``, ``subprocess.Popen``, ...) and ``os.kill``; ``ctypes``;
     opening a file for writing, and removing, renaming, creating or chmod-ing paths, outside the
     working directory.
   Then the user's code runs as ``__main__`` from ``main.py`` in that directory.
3. The parent keeps at most ``max_output_bytes`` of stdout and of stderr (the rest is drained and
   counted), and kills the whole process group at the wall-clock limit.

What it does NOT protect against (use a container, gVisor, nsjail or a VM for hostile code):

* Audit hooks are not a sandbox (PEP 578 says so): code that corrupts interpreter memory, reaches
  an unaudited C function, or uses a C extension it finds can get past them. The hook keeps honest
  mistakes and lazy escapes in, nothing more.
* Reads are not restricted: the code can read every file the user running slime can read
  (credentials included) and print it; only writes outside the working directory are denied.
* Without a network namespace (no permission for ``unshare``) network denial rests on the audit hook alone.
* ``RLIMIT_NPROC`` counts every process and thread of the same real uid on the machine and is
  ignored for root; as root a fork bomb is stopped by the audit hook's fork ban, not the kernel.
* No syscall filter (seccomp), no filesystem or PID namespace, no cgroup: CPU and memory are
  bounded per process, not per sandbox, and ``RLIMIT_AS`` counts virtual memory (a program that
  maps much but touches little is refused early).
* Only the standard library is importable (``-S``); tasks that need numpy and the like do not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time

from slime.rollout.tools.registry import Tool

__all__ = ["Sandbox", "SandboxResult", "python_tool", "format_result"]

_BOOTSTRAP = r'''
import os, resource, sys
cpu_s, as_bytes, fsize_bytes, nofile, nproc, netns = (int(x) for x in sys.argv[1:7])
work = os.path.realpath(os.getcwd())
for lim, val in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, as_bytes), (resource.RLIMIT_FSIZE, fsize_bytes),
                 (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(lim, (val, val))
network = "audit-hook"
try:
    if not netns:
        raise OSError("network namespace not requested")
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x40000000) == 0 or libc.unshare(0x10000000 | 0x40000000) == 0:
        network = "netns"
    del libc, ctypes
    sys.modules.pop("ctypes", None)
except Exception:
    pass
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
sys.stderr.write("\x00sandbox-network=" + network + "\n")
_DENY = ("os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.kill", "os.killpg",
         "subprocess.Popen", "pty.spawn", "signal.pthread_kill", "ctypes.", "socket.", "sys.addaudithook",
         "os.add_dll_directory", "_posixsubprocess", "webbrowser.open", "os.startfile")
_PATH_EVENTS = {"os.remove", "os.unlink", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                "os.link", "os.symlink", "os.truncate", "os.utime", "os.chflags", "os.lchmod", "os.lchown",
                "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree", "os.mkfifo", "os.mknod"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_realpath, _fspath, _sep = os.path.realpath, os.fspath, os.sep

def _inside(p):
    if isinstance(p, int):
        return True
    try:
        p = _realpath(_fspath(p))
    except Exception:
        return False
    if isinstance(p, bytes):
        p = p.decode("utf-8", "replace")
    return p == work or p.startswith(work + _sep)

def _hook(event, args):
    for d in _DENY:
        if event == d or (d.endswith(".") and event.startswith(d)) or event.startswith(d + "."):
            raise PermissionError("sandbox: " + event + " is not allowed")
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and not _inside(path):
            raise PermissionError("sandbox: writing outside the working directory is not allowed: " + repr(path))
    elif event in _PATH_EVENTS:
        for a in args:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError("sandbox: " + event + " outside the working directory is not allowed: " + repr(a))

sys.addaudithook(_hook)
del _hook
with open("main.py", "rb") as f:
    _src = f.read()
_g = {"__name__": "__main__", "__file__": os.path.join(work, "main.py"), "__builtins__": __builtins__}
exec(compile(_src, "main.py", "exec"), _g)
'''
_NETWORK_MARK = b"\x00sandbox-network="
_REAP_TIMEOUT_S = 2.0
"""After a kill, how long to wait for the pipes to close (something outside the group may hold them)."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run.

    Attributes:
        stdout / stderr: decoded (UTF-8, replacement), each at most ``max_output_bytes`` long.
        returncode: the child's exit status (negative: killed by that signal); None if never started.
        timed_out: the wall-clock limit killed it.
        elapsed_s: wall seconds from spawn to exit.
        truncated: some output was dropped past ``max_output_bytes``.
        network: ``"netns"`` (own network namespace) or ``"audit-hook"`` (hook only).
    """

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    elapsed_s: float
    truncated: bool = False
    network: str = "unknown"

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def memory_exceeded(self) -> bool:
        return "MemoryError" in self.stderr


class Sandbox:
    """Runs code with limits; concurrent runs are bounded by ``max_concurrency``.

    Args:
        timeout_s: wall-clock seconds per run; the process group is killed past it.
        cpu_time_s: ``RLIMIT_CPU`` seconds (default: ``ceil(timeout_s)``).
        memory_bytes: ``RLIMIT_AS`` (virtual memory), default 1 GiB.
        max_file_bytes: ``RLIMIT_FSIZE``, default 16 MiB.
        max_open_files: ``RLIMIT_NOFILE``.
        max_processes: ``RLIMIT_NPROC`` (see the module docstring for what it does not do).
        max_output_bytes: kept per stream.
        max_concurrency: child processes at once (default: the CPU count).
        network_namespace: try ``unshare(CLONE_NEWNET)``; False leaves network denial to the audit hook.
    """

    def __init__(self, *, timeout_s: float = 5.0, cpu_time_s: int | None = None, memory_bytes: int = 1 << 30,
                 max_file_bytes: int = 16 << 20, max_open_files: int = 64, max_processes: int = 1,
                 max_output_bytes: int = 64 << 10, max_concurrency: int | None = None, network_namespace: bool = True):
        if timeout_s <= 0 or memory_bytes <= 0 or max_output_bytes <= 0:
            raise ValueError(f"Sandbox: timeout_s={timeout_s}, memory_bytes={memory_bytes}, max_output_bytes={max_output_bytes} must be > 0")
        self.timeout_s = timeout_s
        self.cpu_time_s = cpu_time_s if cpu_time_s is not None else max(1, int(-(-timeout_s // 1)))
        self.memory_bytes, self.max_file_bytes = memory_bytes, max_file_bytes
        self.max_open_files, self.max_processes = max_open_files, max_processes
        self.max_output_bytes = max_output_bytes
        self.network_namespace = network_namespace
        self._slots = asyncio.Semaphore(max_concurrency or os.cpu_count() or 1)

    async def run(self, code: str, *, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        """Run ``code`` (Python source) with ``stdin``; never raises for what the code does."""
        limit_s = timeout_s if timeout_s is not None else self.timeout_s
        async with self._slots:
            workdir = tempfile.mkdtemp(prefix="slime-sandbox-")
            try:
                with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
                    f.write(code)
                return await self._spawn(workdir, stdin.encode("utf-8"), limit_s)
            finally:
                await asyncio.to_thread(shutil.rmtree, workdir, True)

    async def _spawn(self, workdir: str, stdin: bytes, limit_s: float) -> SandboxResult:
        argv = [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, str(self.cpu_time_s), str(self.memory_bytes),
                str(self.max_file_bytes), str(self.max_open_files), str(self.max_processes), str(int(self.network_namespace))]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=workdir, env=env, start_new_session=True,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = _Capped(self.max_output_bytes), _Capped(self.max_output_bytes)
        timed_out = False
        try:
            async with asyncio.timeout(limit_s):
                await asyncio.gather(_feed(proc.stdin, stdin), out.drain(proc.stdout), err.drain(proc.stderr), proc.wait())
        except BaseException as exc:  # timeout, or our caller cancelled: never leave the group running
            timed_out = isinstance(exc, TimeoutError)
            _kill_group(proc.pid)
            # On 3.11 ``wait()`` also waits for the pipes to reach EOF, so drain them (discarding) first.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REAP_TIMEOUT_S):
                    await asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr), proc.wait())
            if not timed_out:
                raise
        stderr_bytes, network = _split_network_mark(bytes(err.data))
        return SandboxResult(
            stdout=bytes(out.data).decode("utf-8", "replace"), stderr=stderr_bytes.decode("utf-8", "replace"),
            returncode=proc.returncode, timed_out=timed_out, elapsed_s=time.monotonic() - t0,
            truncated=out.dropped > 0 or err.dropped > 0, network=network,
        )


class _Capped:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.cap, self.data, self.dropped = cap, bytearray(), 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            room = self.cap - len(self.data)
            self.data += chunk[:room]
            self.dropped += max(0, len(chunk) - room)
            await asyncio.sleep(0)  # read() returns without yielding while data is buffered


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
            await pipe.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the child exited or closed stdin without reading it all
    finally:
        pipe.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _split_network_mark(stderr: bytes) -> tuple[bytes, str]:
    start = stderr.find(_NETWORK_MARK)
    if start < 0:
        return stderr, "unknown"
    end = stderr.find(b"\n", start)
    end = len(stderr) if end < 0 else end
    network = stderr[start + len(_NETWORK_MARK):end].decode("ascii", "replace")
    return stderr[:start] + stderr[end + 1:], network


def python_tool(sandbox: Sandbox) -> Tool:
    """The ``python`` tool: run the model's code in ``sandbox``; the model sees stdout (and errors)."""
    async def run_python(arguments: dict) -> str:
        code = arguments.get("code")
        if not isinstance(code, str):
            raise ValueError("'code' must be a string of Python source")
        result = await sandbox.run(code)
        return format_result(result)

    return Tool(
        name="python",
        description="Run Python 3 code (standard library only, no network) and return what it prints.",
        parameters={"type": "object", "properties": {"code": {"type": "string", "description": "Python source; print() the results"}},
                    "required": ["code"]},
        fn=run_python,
    )


def format_result(result: SandboxResult) -> str:
    """What the model sees: stdout, then the last lines of stderr and why the run failed, if it did."""
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if result.timed_out:
        parts.append(f"[killed: wall-clock limit of {result.elapsed_s:.1f}s reached]")
    elif result.returncode != 0:
        tail = "\n".join(result.stderr.rstrip().splitlines()[-8:])
        parts.append(f"[exit status {result.returncode}]" + (f"\n{tail}" if tail else ""))
    if result.truncated:
        parts.append("[output truncated]")
    return "\n".join(parts) if parts else "[no output]"
