"""The unsafe mode's bootstrap (no OS sandbox, ``--allow-unsafe-code-execution``): an in-process audit hook.

``HOOK`` runs in the child before the code: a network namespace if the kernel gives one (else the hook
denies sockets), then a PEP 578 audit hook that denies process creation, signals, ``ctypes``, sockets and
writes outside the working directory. Model-written code can get past it (``_posixsubprocess.fork_exec``
is not audited, for one): audit hooks are not a security boundary, which is why this mode runs only when
unsafe execution is allowed. It expects ``work`` (the working directory) and ``netns`` (whether to try a
network namespace) to be defined by the code before it (``sandbox._LIMITS``).
"""

__all__ = ["HOOK", "NETWORK_MARK"]

NETWORK_MARK = b"\x00sandbox-network="
"""What ``HOOK`` writes first to stderr, then the network isolation it got (``netns`` or ``audit-hook``)."""

HOOK = r"""
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
