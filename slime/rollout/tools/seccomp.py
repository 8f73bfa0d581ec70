"""The sandbox's seccomp filter: syscalls that tests never need fail with ``EPERM`` (bwrap's ``--seccomp FD``).

The filter is built with libseccomp (``libseccomp.so.2``, Debian package ``libseccomp2``; called through
``ctypes``, so no Python binding is needed), exported as classic BPF once per process (``filter_bpf()``)
and handed to bubblewrap, which loads it right before it executes the sandbox's command; every process
of the sandbox inherits it and none can remove it. Everything not listed below is allowed. Syscalls of
a foreign ABI (i386 ``int 0x80``, x32) kill the thread: libseccomp's default for a non-native architecture.

Denied, and why (``DENIED``):

* tracing other processes: ``ptrace``, ``process_vm_readv``/``writev``, ``pidfd_getfd`` (a traced
  bwrap init can have its parent-death signal cleared and outlive the run);
* kernel keyrings: ``keyctl``, ``add_key``, ``request_key`` (a keyring is per host user, so a key
  would be a channel between sandboxes that persists after them);
* mounts and namespaces: ``mount``, ``umount2``, ``pivot_root``, ``chroot``, the new mount API
  (``fsopen`` ... ``mount_setattr``, ``open_tree``, ``move_mount``), ``unshare``, ``setns``,
  ``clone`` with any ``CLONE_NEW*`` flag, and ``clone3`` (its flags sit in memory the filter
  cannot read, so it fails with ``ENOSYS`` and the C library falls back to ``clone``);
  ``open_by_handle_at`` (opens files by handle, past the mount view);
* kernel modules and kexec: ``init_module``, ``finit_module``, ``delete_module``, ``kexec_load``,
  ``kexec_file_load``;
* the host's clock: ``clock_settime``, ``clock_adjtime``, ``settimeofday``, ``adjtimex``;
* host state: ``reboot``, ``swapon``, ``swapoff``, ``acct``, ``quotactl``, ``quotactl_fd``,
  ``syslog``, ``vhangup``, ``iopl``, ``ioperm``;
* large kernel surfaces a test has no use for: ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring_setup``/``enter``/``register``, ``fanotify_init``, ``lookup_dcookie``;
* ``personality``, queries included (it turns off address-space randomisation or makes data
  executable; tests have no use for execution domains);
* channels between sandboxes that run at once: every sandbox sees the same host files (read-only
  binds of one inode), and a lock or an inotify watch on a file is seen from every mount view of it.
  A red-team test passed a correct sample's answer to a concurrent sample that computed nothing by
  ``flock``-ing 8 shared library files (both scored 1.0). Denied: ``flock``, ``fcntl``'s lock and
  lease commands (``F_GETLK``/``F_SETLK``/``F_SETLKW``, their ``F_OFD_*`` forms, ``F_SETLEASE``/
  ``F_GETLEASE``, ``FCNTL_LOCK_COMMANDS``) and ``inotify_init``/``inotify_init1``/``inotify_add_watch``.
  Code that locks a file of its own (sqlite) gets ``EPERM``; tests of the code verifier have no use for
  it. CPU-time contention stays a (slow, noisy) channel no filter closes.

Most of these already need a capability the sandbox does not have; the filter is the second wall,
and the only one for ``ptrace`` of a process of the same user and for the keyrings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

__all__ = ["DENIED", "CLONE_NAMESPACE_FLAGS", "FCNTL_LOCK_COMMANDS", "filter_bpf", "program_fd"]

DENIED = (
    *("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"),
    *("keyctl", "add_key", "request_key"),
    *("mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount"),
    *("mount_setattr", "unshare", "setns", "open_by_handle_at"),
    *("init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load"),
    *("clock_settime", "clock_adjtime", "settimeofday", "adjtimex"),
    *("reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "iopl", "ioperm"),
    *("bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register"),
    *("fanotify_init", "lookup_dcookie", "personality"),
    *("flock", "inotify_init", "inotify_init1", "inotify_add_watch"),
)
"""Syscalls that always fail with ``EPERM`` (names as libseccomp spells them; those this architecture lacks are skipped)."""

CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
"""``CLONE_NEWNS``, ``NEWCGROUP``, ``NEWUTS``, ``NEWIPC``, ``NEWUSER``, ``NEWPID``, ``NEWNET``, ``NEWTIME``: ``clone`` with any fails."""

FCNTL_LOCK_COMMANDS = (5, 6, 7, 36, 37, 38, 1024, 1025)
"""``fcntl`` commands that fail: ``F_GETLK``, ``F_SETLK``, ``F_SETLKW``, ``F_OFD_GETLK``, ``F_OFD_SETLK``,
``F_OFD_SETLKW``, ``F_SETLEASE``, ``F_GETLEASE`` (Linux's numbers, the same on x86_64 and arm64)."""

_ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP_EQ = 4
_CMP_MASKED_EQ = 7


class _ArgCmp(ctypes.Structure):
    """libseccomp's ``struct scmp_arg_cmp``: argument index, comparison, two operands."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def filter_bpf() -> bytes | str:
    """The filter as a BPF program (bytes for bwrap's ``--seccomp``), or why there is none (one line). Cached."""
    return _build()


@functools.cache
def _build() -> bytes | str:
    try:
        lib = _load()
    except OSError as exc:
        return f"libseccomp is not available ({exc}; as root: apt-get install libseccomp2)"
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        return "libseccomp could not create a filter (seccomp_init failed)"
    try:
        _add_rules(lib, ctx)
        return _export(lib, ctx)
    except OSError as exc:
        return f"libseccomp could not build the sandbox's filter ({exc})"
    finally:
        lib.seccomp_release(ctx)


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype, lib.seccomp_init.argtypes = ctypes.c_void_p, [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _add_rules(lib: ctypes.CDLL, ctx: int) -> None:
    """Every rule of the module docstring; raises OSError naming the rule libseccomp refused."""
    deny = _ACT_ERRNO | errno.EPERM
    for name in DENIED:
        _rule(lib, ctx, deny, name)
    for flag in CLONE_NAMESPACE_FLAGS:
        _rule(lib, ctx, deny, "clone", _ArgCmp(0, _CMP_MASKED_EQ, flag, flag))
    _rule(lib, ctx, _ACT_ERRNO | errno.ENOSYS, "clone3")
    for cmd in FCNTL_LOCK_COMMANDS:
        _rule(lib, ctx, deny, "fcntl", _ArgCmp(1, _CMP_EQ, cmd, 0))


def _rule(lib: ctypes.CDLL, ctx: int, action: int, name: str, *args: _ArgCmp) -> None:
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number < 0:  # not a syscall of this architecture (e.g. iopl on arm64)
        return
    array = (_ArgCmp * len(args))(*args) if args else None
    rc = lib.seccomp_rule_add_array(ctx, action, number, len(args), array)
    if rc < 0:
        raise OSError(-rc, f"seccomp_rule_add({name}): {os.strerror(-rc)}")


def _export(lib: ctypes.CDLL, ctx: int) -> bytes:
    fd = os.memfd_create("slime-seccomp", os.MFD_CLOEXEC)
    try:
        rc = lib.seccomp_export_bpf(ctx, fd)
        if rc < 0:
            raise OSError(-rc, f"seccomp_export_bpf: {os.strerror(-rc)}")
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def program_fd(bpf: bytes) -> int:
    """A fresh file descriptor (close-on-exec, at offset 0) holding ``bpf``, for one bwrap start."""
    fd = os.memfd_create("slime-seccomp", os.MFD_CLOEXEC)
    os.write(fd, bpf)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
