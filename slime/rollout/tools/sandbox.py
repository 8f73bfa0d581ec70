"""Run untrusted Python (model-written code) in an OS-level sandbox, with resource limits.

What a run does (``Sandbox.run(code, stdin=...)``):

1. The code is written to ``main.py`` in a fresh host temporary directory (deleted afterwards).
2. bubblewrap (``bwrap.py``) starts ``python -I -S`` (isolated mode, no ``site``: the standard library
   only) in its own user, PID, mount, network, IPC and UTS namespaces, with no capabilities, a
   cleared environment, a read-only view of only what the interpreter needs, a fresh ``/proc``
   (no host process is visible) and a size-bounded tmpfs ``/sandbox`` as its working directory and
   only writable place. ``main.py`` is bound read-only into it.
3. A bootstrap (``_LIMITS``) sets ``resource`` limits (soft = hard): CPU seconds, address space,
   file size, open files, core size 0 and processes (``RLIMIT_NPROC``, per sandbox: each has its
   own user namespace), then runs the code as ``__main__``.
4. The parent keeps at most ``max_output_bytes`` of stdout and of stderr (the rest is drained and
   counted) and, at the wall-clock limit, kills bwrap, whose death ends every process of the
   sandbox's PID namespace. Processes the code leaves behind die when it exits, the same way.

Where bwrap is missing or cannot create namespaces (``bwrap.probe()``, cached), constructing a
``Sandbox`` raises ``SandboxUnavailable`` unless ``allow_unsafe=True``
(``--allow-unsafe-code-execution``); the code then runs in a plain child process guarded only by
an in-process audit hook (``_HOOK``), which model-written code can get past: PEP 578 hooks are not
a security boundary (``_posixsubprocess.fork_exec`` is not audited, for one).

What the OS sandbox does not do: no seccomp filter (the kernel's whole syscall surface is reachable
from inside the namespaces), no cgroup (``RLIMIT_AS`` bounds each process, not the sandbox; CPU
seconds likewise), and, when the sandbox has to run as the host's root, no process-count limit
(``bwrap.py``). Only the standard library is importable (``-S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import time

from slime.errors import ConfigError
from slime.rollout.tools import bwrap
from slime.rollout.tools.registry import Tool

__all__ = [
    "Sandbox",
    "SandboxResult",
    "SandboxUnavailable",
    "python_tool",
    "format_result",
    "sandbox_unavailable_reason",
    "process_limit_enforced",
]

logger = logging.getLogger(__name__)


class SandboxUnavailable(ConfigError):
    """No OS-level sandbox here and unsafe execution was not allowed; the message names the fix."""


def sandbox_unavailable_reason() -> str | None:
    """Why bwrap cannot sandbox code on this machine (one line), or None when it can."""
    found = bwrap.probe()
    return found if isinstance(found, str) else None


def process_limit_enforced() -> bool:
    """Whether the sandbox's ``RLIMIT_NPROC`` binds here (not when it runs as the host's root)."""
    found = bwrap.probe()
    return not isinstance(found, str) and found.process_limit_enforced


_LIMITS = r"""
import os, resource, sys
cpu_s, as_bytes, fsize_bytes, nofile, nproc, netns = (int(x) for x in sys.argv[1:7])
work = os.path.realpath(os.getcwd())
for lim, val in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, as_bytes), (resource.RLIMIT_FSIZE, fsize_bytes),
                 (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(lim, (val, val))
"""
# Unsafe mode only (no bwrap): a network namespace if the kernel gives one, then an audit hook.
_HOOK = r"""
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
"""
_RUN = r"""
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
with open("main.py", "rb") as f:
    _src = f.read()
_g = {"__name__": "__main__", "__file__": os.path.join(work, "main.py"), "__builtins__": __builtins__}
exec(compile(_src, "main.py", "exec"), _g)
"""
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
        network: ``"netns"`` (own network namespace: always with bwrap) or ``"audit-hook"`` (unsafe mode, hook only).
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
    """Runs code in bubblewrap with limits; concurrent runs are bounded by ``max_concurrency``.

    Args:
        timeout_s: wall-clock seconds per run; the whole sandbox is killed past it.
        cpu_time_s: ``RLIMIT_CPU`` seconds (default: ``ceil(timeout_s)``).
        memory_bytes: ``RLIMIT_AS`` (virtual memory, per process), default 1 GiB.
        max_file_bytes: ``RLIMIT_FSIZE``, default 16 MiB.
        max_disk_bytes: size of the writable tmpfs ``/sandbox`` (all files together), default 64 MiB.
        max_open_files: ``RLIMIT_NOFILE``.
        max_processes: processes and threads the code may have at once, itself included.
        max_output_bytes: kept per stream.
        max_concurrency: sandboxes at once (default: the CPU count).
        network_namespace: unsafe mode only: try ``unshare(CLONE_NEWNET)``; False leaves network
            denial to the audit hook.
        allow_unsafe: where bwrap cannot sandbox (``sandbox_unavailable_reason()``), run the code in
            a plain child process with an audit hook instead of refusing (``--allow-unsafe-code-execution``).

    Attributes:
        isolation: ``"bwrap"`` (OS sandbox) or ``"unsafe"`` (audit hook only).

    Raises:
        SandboxUnavailable: no working bwrap and ``allow_unsafe`` is False.
        ValueError: a non-positive limit.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        cpu_time_s: int | None = None,
        memory_bytes: int = 1 << 30,
        max_file_bytes: int = 16 << 20,
        max_disk_bytes: int = 64 << 20,
        max_open_files: int = 64,
        max_processes: int = 8,
        max_output_bytes: int = 64 << 10,
        max_concurrency: int | None = None,
        network_namespace: bool = True,
        allow_unsafe: bool = False,
    ):
        if min(timeout_s, memory_bytes, max_output_bytes, max_disk_bytes, max_processes) <= 0:
            raise ValueError(
                f"Sandbox: timeout_s={timeout_s}, memory_bytes={memory_bytes}, max_output_bytes={max_output_bytes}, "
                f"max_disk_bytes={max_disk_bytes}, max_processes={max_processes} must be > 0"
            )
        self.timeout_s = timeout_s
        self.cpu_time_s = cpu_time_s if cpu_time_s is not None else max(1, int(-(-timeout_s // 1)))
        self.memory_bytes, self.max_file_bytes, self.max_disk_bytes = memory_bytes, max_file_bytes, max_disk_bytes
        self.max_open_files, self.max_processes = max_open_files, max_processes
        self.max_output_bytes = max_output_bytes
        self.network_namespace = network_namespace
        found = bwrap.probe()
        self._launcher = None if isinstance(found, str) else found
        if self._launcher is None and not allow_unsafe:
            raise SandboxUnavailable(
                f"code execution refused: model-written code runs only in an OS sandbox and {found}; install bubblewrap "
                "(as root: apt-get install bubblewrap) or pass --allow-unsafe-code-execution to run it unsandboxed"
            )
        if self._launcher is None:
            logger.warning("running model-written code WITHOUT an OS sandbox (--allow-unsafe-code-execution): %s", found)
        self.isolation = "bwrap" if self._launcher is not None else "unsafe"
        self._slots = asyncio.Semaphore(max_concurrency or os.cpu_count() or 1)

    async def run(self, code: str, *, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        """Run ``code`` (Python source) with ``stdin``; never raises for what the code does."""
        limit_s = timeout_s if timeout_s is not None else self.timeout_s
        async with self._slots:
            workdir = tempfile.mkdtemp(prefix="slime-sandbox-")
            try:
                main_py = os.path.join(workdir, "main.py")
                with open(main_py, "w", encoding="utf-8") as f:
                    f.write(code)
                os.chmod(workdir, 0o755)  # bwrap may run as nobody; the code never writes here
                os.chmod(main_py, 0o644)
                return await self._spawn(workdir, stdin.encode("utf-8"), limit_s)
            finally:
                await asyncio.to_thread(shutil.rmtree, workdir, True)

    def _command(self, workdir: str) -> tuple[list[str], dict]:
        """argv and extra spawn arguments of one run."""
        limits = [str(self.cpu_time_s), str(self.memory_bytes), str(self.max_file_bytes), str(self.max_open_files)]
        if self._launcher is not None:
            # bwrap's init (PID 1 of the sandbox) counts against RLIMIT_NPROC too.
            args = ["-I", "-S", "-c", _LIMITS + _RUN, *limits, str(self.max_processes + 1), "0"]
            argv = self._launcher.argv(os.path.join(workdir, "main.py"), args, tmpfs_bytes=self.max_disk_bytes)
            return argv, {"cwd": "/", **self._launcher.spawn_kwargs()}
        argv = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _LIMITS + _HOOK + _RUN,
            *limits,
            str(self.max_processes),
            str(int(self.network_namespace)),
        ]
        return argv, {"cwd": workdir}

    async def _spawn(self, workdir: str, stdin: bytes, limit_s: float) -> SandboxResult:
        argv, kwargs = self._command(workdir)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            start_new_session=True,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            **kwargs,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None  # all three are PIPE
        out, err = _Capped(self.max_output_bytes), _Capped(self.max_output_bytes)
        timed_out = False
        try:
            async with asyncio.timeout(limit_s):
                await asyncio.gather(_feed(proc.stdin, stdin), out.drain(proc.stdout), err.drain(proc.stderr), proc.wait())
        except BaseException as exc:  # timeout, or our caller cancelled: never leave the sandbox running
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
            stdout=bytes(out.data).decode("utf-8", "replace"),
            stderr=stderr_bytes.decode("utf-8", "replace"),
            returncode=proc.returncode,
            timed_out=timed_out,
            elapsed_s=time.monotonic() - t0,
            truncated=out.dropped > 0 or err.dropped > 0,
            network="netns" if self._launcher is not None else network,
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
    network = stderr[start + len(_NETWORK_MARK) : end].decode("ascii", "replace")
    return stderr[:start] + stderr[end + 1 :], network


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
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source; print() the results"}},
            "required": ["code"],
        },
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
