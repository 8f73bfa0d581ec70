"""The sandbox holds when its caller is root (issue 26, item 2): each hole the issue found, as a test.

Before, as root, the sandbox ran as the host's root (uid 65534 inside mapped to 0 outside): host sysctls
were writable, the host root's keyring kept keys between sandboxes, the code could ``ptrace`` bwrap's
init and clear its parent-death signal to outlive the run, and no process or memory limit bound the
sandbox as a whole. Each test runs small programs in fresh sandboxes (well under a second each, the
concurrency test about one); they are skipped where the OS sandbox is incomplete (the refusal is
tested in ``test_sandbox_refusal.py``).
"""

from __future__ import annotations

import asyncio
import os
import platform
import time

import pytest

from slime.rollout.tools.sandbox import Sandbox, format_result, sandbox_unavailable_reason

requires_sandbox = pytest.mark.skipif(
    sandbox_unavailable_reason() is not None, reason=f"no OS sandbox: {sandbox_unavailable_reason()}"
)
pytestmark = requires_sandbox

LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
# (add_key, keyctl) syscall numbers, for the architectures we run on.
KEY_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}


def _marker() -> str:
    """A ``sleep`` argument no other process has: seconds, with a fraction unique to this test run."""
    return f"47.{os.getpid()}{time.monotonic_ns() % 1000000:06d}"


def _processes_with(needle: bytes) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def _our_cgroups_left() -> list[str]:
    """Per-run cgroups of this process still on the host (none once every run has returned)."""
    try:
        from slime.rollout.tools import isolation
    except ImportError:  # the sandbox before per-run cgroups
        return []
    roots = isolation.probe().cgroups
    parents = roots.parents if roots is not None else ()
    return [os.path.join(p, n) for p in parents for n in os.listdir(p) if n.startswith(f"slime-sbx-{os.getpid()}-")]


@pytest.fixture
def box():
    return Sandbox(timeout_s=3.0, memory_bytes=256 << 20, max_output_bytes=8192)


async def test_sysctls_cannot_be_written_from_inside(box):
    code = """
for name in ("kernel/pid_max", "kernel/core_pattern"):
    path = "/proc/sys/" + name
    value = open(path).read()
    try:
        with open(path, "w") as f:
            f.write(value)  # the value it already has: harmless where the write goes through
        print("written", name)
    except OSError as e:
        print("refused", name, type(e).__name__)
"""
    result = await box.run(code)
    assert result.ok, result.stderr
    assert "written" not in result.stdout and result.stdout.count("refused") == 2, result.stdout


async def test_keyrings_are_out_of_reach_and_keep_nothing(box):
    if platform.machine() not in KEY_SYSCALLS:
        pytest.skip(f"key syscall numbers unknown for {platform.machine()}")
    add_key, keyctl = KEY_SYSCALLS[platform.machine()]
    name = f"slime-sandbox-test-{os.getpid()}-{time.monotonic_ns()}".encode()
    # KEY_SPEC_USER_KEYRING (-4): the keyring of the host user the sandbox runs as, shared by all its processes.
    add = (
        LIBC
        + f"r = libc.syscall({add_key}, b'user', {name!r}, b'secret', 6, -4)\nprint('add', r, os.strerror(ctypes.get_errno()) if r < 0 else '')\n"
    )
    # KEYCTL_SEARCH (10) in the same keyring, from the next sandbox.
    find = (
        LIBC
        + f"r = libc.syscall({keyctl}, 10, -4, b'user', {name!r}, 0)\nprint('found' if r >= 0 else 'absent', os.strerror(ctypes.get_errno()))\n"
    )
    added, found = await box.run(add), await box.run(find)
    assert added.ok and found.ok, added.stderr + found.stderr
    assert added.stdout.startswith("add -1 "), added.stdout
    assert found.stdout.startswith("absent"), found.stdout


async def test_the_sandbox_init_cannot_be_traced(box):
    # PTRACE_ATTACH (16) to PID 1 (bwrap's init), and a read of its memory with process_vm_readv.
    code = (
        LIBC
        + """
r = libc.ptrace(16, 1, 0, 0)
print("ptrace", r, os.strerror(ctypes.get_errno()) if r < 0 else "attached")
if r == 0:
    os.waitpid(1, 0x40000000)
    libc.ptrace(17, 1, 0, 0)  # PTRACE_DETACH: let init go on
buf = ctypes.create_string_buffer(8)
local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
remote = (ctypes.c_void_p * 2)(0x400000, 8)
r = libc.process_vm_readv(1, local, 1, remote, 1, 0)
print("vm_readv", r, os.strerror(ctypes.get_errno()) if r < 0 else "read")
"""
    )
    result = await box.run(code)
    assert "attached" not in result.stdout and "ptrace -1 " in result.stdout, result.stdout + result.stderr
    assert result.ok, result.stderr
    assert "vm_readv -1 " in result.stdout, result.stdout


# x86-64: make PID 1 (stopped inside a syscall) run prctl(PR_SET_PDEATHSIG, 0), then resume it as it was.
CLEAR_INIT_DEATH_SIGNAL = """
class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in
                "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs".split()]
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def clear_init_death_signal():
    if libc.ptrace(16, 1, None, None) != 0:
        return "ptrace refused: " + os.strerror(ctypes.get_errno())
    os.waitpid(1, 0x40000000)
    saved = Regs()
    libc.ptrace(12, 1, None, ctypes.byref(saved))
    if libc.ptrace(1, 1, ctypes.c_void_p(saved.rip - 2), None) & 0xFFFF != 0x050F:
        libc.ptrace(17, 1, None, None)
        return "init is not in a syscall"
    regs = Regs.from_buffer_copy(saved)
    regs.rip, regs.rax, regs.rdi, regs.rsi, regs.orig_rax = saved.rip - 2, 157, 1, 0, 2**64 - 1
    libc.ptrace(13, 1, None, ctypes.byref(regs))
    libc.ptrace(9, 1, None, None)
    os.waitpid(1, 0x40000000)
    libc.ptrace(13, 1, None, ctypes.byref(saved))
    libc.ptrace(17, 1, None, None)
    return "cleared"
"""


async def test_no_process_outlives_the_run():
    marker = _marker()
    code = LIBC + CLEAR_INIT_DEATH_SIGNAL * (platform.machine() == "x86_64")
    code += f"""
print(clear_init_death_signal() if "clear_init_death_signal" in globals() else "not x86-64", flush=True)
if os.fork() == 0:  # a daemon: double fork, own session, no parent-death signal
    os.setsid()
    if os.fork() == 0:
        libc.prctl(1, 0)
        os.execv("/bin/sleep", ["sleep", "{marker}"])
    os._exit(0)
os.wait()
os.execv("/bin/sleep", ["sleep", "{marker}"])  # and the program itself runs past the wall clock
"""
    needle = f"sleep\x00{marker}".encode()
    try:
        result = await Sandbox(timeout_s=1.0).run(code)
        survivors = _processes_with(needle)  # at once: run() returns only once the sandbox is gone
        assert result.timed_out, result.stdout + result.stderr
        assert survivors == [], f"{len(survivors)} processes outlived the run ({result.stdout.strip()})"
        assert _our_cgroups_left() == []
    finally:
        for pid in _processes_with(needle):
            os.kill(pid, 9)


async def test_threads_and_children_together_are_bounded_by_max_processes():
    code = """
import os, threading, time
stop = threading.Event()
threads = 0
for _ in range(4):
    threading.Thread(target=stop.wait).start()
    threads += 1
children = 0
try:
    while threads + children < 64:
        if os.fork() == 0:
            time.sleep(10)
            os._exit(0)
        children += 1
except OSError as e:
    pass
print(threads, children, flush=True)
stop.set()
"""
    box = Sandbox(timeout_s=5.0, max_processes=8)
    result = await box.run(code)
    threads, children = (int(x) for x in result.stdout.split())
    assert threads == 4, result.stdout + result.stderr
    assert 1 + threads + children <= box.max_processes, (
        f"{threads} threads and {children} children against a limit of {box.max_processes}"
    )


async def test_memory_is_bounded_for_the_whole_sandbox():
    # Each child holds 60 MiB, well under the per-process limit; four of them together are over the sandbox's.
    code = """
import os, time
pids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        held = b"x" * (60 << 20)
        time.sleep(1.0)
        os._exit(0)
    pids.append(pid)
held = sum(os.waitpid(p, 0)[1] == 0 for p in pids)
print("children held", held)
"""
    result = await Sandbox(timeout_s=5.0, memory_bytes=160 << 20).run(code)
    assert "children held 4" not in result.stdout, "4 x 60 MiB held at once against a limit of 160 MiB"
    assert not result.ok and result.memory_exceeded, result
    assert "memory limit" in format_result(result)  # what the model is told


FORK_TO_THE_LIMIT = """
import os, time
n = 0
try:
    while n < 64:
        if os.fork() == 0:
            time.sleep(10)
            os._exit(0)
        n += 1
except OSError:
    pass
time.sleep(0.3)  # hold them while the other sandbox forks
print("children", n, "sum", sum(range(1000)))
"""


async def test_concurrent_sandboxes_do_not_share_limits():
    small, large = Sandbox(timeout_s=5.0, max_processes=4), Sandbox(timeout_s=5.0, max_processes=12)
    for _ in range(3):
        a, b = await asyncio.gather(small.run(FORK_TO_THE_LIMIT), large.run(FORK_TO_THE_LIMIT))
        assert a.ok and b.ok, a.stderr + b.stderr
        # The program is one task; the rest of each sandbox's limit is its children, whatever the other does.
        assert a.stdout == f"children {small.max_processes - 1} sum 499500\n", a.stdout
        assert b.stdout == f"children {large.max_processes - 1} sum 499500\n", b.stdout


async def test_the_sandbox_is_never_the_host_root(box):
    # Seen from the host (/proc/<pid>/status): a uid map read inside shows only the namespace one level up.
    name = f"slimeuid{os.getpid() % 10000}"
    code = (
        LIBC
        + f"libc.prctl(15, {name.encode()!r})  # PR_SET_NAME, so the host can find this process\nimport time; time.sleep(1)\n"
    )
    task = asyncio.ensure_future(box.run(code))
    seen: list[str] = []
    deadline = time.monotonic() + 1.5
    while not seen and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == name:
                        with open(f"/proc/{pid}/status") as s:
                            seen = [line for line in s if line.startswith(("Uid:", "Gid:"))]
            except OSError:
                pass
    result = await task
    assert seen, f"the sandboxed process was not found from the host: {result}"
    ids = [int(x) for line in seen for x in line.split()[1:]]
    assert 0 not in ids, f"host ids of the sandboxed process: {seen}"


UID_AND_HOLD = "import os, time\nprint(os.getuid(), os.getgid(), flush=True)\ntime.sleep(0.5)\n"


async def test_concurrent_sandboxes_run_as_host_users_of_their_own():
    """Sandboxes sharing one host uid share what the kernel keeps per user (RLIMIT_NPROC's count, the user
    keyring, signal and ptrace reach): as root each run has a uid of its own (issue 31 item 7)."""
    from slime.rollout.tools import run_uid

    boxes = [Sandbox(timeout_s=5.0) for _ in range(3)]
    results = await asyncio.gather(*(box.run(UID_AND_HOLD) for box in boxes))
    assert all(r.ok for r in results), [r.stderr for r in results]
    ids = [tuple(int(x) for x in r.stdout.split()) for r in results]
    if not boxes[0]._launcher.sets_uid:  # not root: each its own user namespace, nobody inside
        assert ids == [(65534, 65534)] * 3
        return
    assert len({uid for uid, _ in ids}) == 3 and all(uid == gid >= run_uid.UID_BASE for uid, gid in ids), ids


def test_a_held_uid_is_not_handed_out_again_until_released(monkeypatch):
    from slime.rollout.tools import run_uid

    monkeypatch.setattr(run_uid.random, "randrange", lambda n: 7)  # every run starts its search at the same uid
    with run_uid.held_uid() as first, run_uid.held_uid() as second:
        assert (first, second) == (run_uid.UID_BASE + 7, run_uid.UID_BASE + 8)
    with run_uid.held_uid() as again:  # released with its block: free for the next run
        assert again == first


async def test_no_lock_or_inotify_channel_between_sandboxes(box):
    """Concurrent sandboxes share the host's read-only files: a lock or a watch on one would pass bits between
    samples (a red-team test copied a correct answer this way). Each is refused, a plain read still works."""
    code = """
import ctypes, fcntl, os, struct
path = "/usr/bin/env"
with open(path, "rb") as f:
    f.read(1)
    for name, call in [
        ("flock", lambda: fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)),
        ("setlk", lambda: fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)),
        ("getlk", lambda: fcntl.fcntl(f, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0))),
        ("ofd", lambda: fcntl.fcntl(f, 37, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0))),
    ]:
        try:
            call()
            print(name, "allowed")
        except OSError as e:
            print(name, "refused", e.errno)
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print("inotify", "allowed" if fd >= 0 else "refused", ctypes.get_errno())
"""
    result = await box.run(code)
    assert result.ok, result.stderr
    assert "allowed" not in result.stdout and result.stdout.count("refused 1") == 5, result.stdout
