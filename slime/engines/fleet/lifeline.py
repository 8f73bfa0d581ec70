"""Engine processes that die with the run that started them, even when it is killed with SIGKILL.

``with_lifeline(argv)`` prefixes a command with ``python -m slime.engines.fleet.lifeline <our pid> --``.
That small program asks the kernel for a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``,
Linux), checks that its parent is still the run (it may have died before the ``prctl``), and
``exec``s the command: same pid, same process group, and the setting survives the ``exec``. When
the run's process dies by any means (``kill -9`` included, where no ``finally`` runs), the kernel
sends SIGKILL to the engine; SGLang's own children die with it (they watch their parent the same
way). Without it a killed ``slime train`` leaves its engines running, reparented to init.

The signal follows the *thread* that forked the child: engines are started from the event loop's
thread, which lives as long as the run (``slime train`` runs its loop in the main thread). On other
systems (no ``prctl``) the command runs unchanged.

Example: ``with_lifeline(["python", "-m", "slime.servers.embedded.server", "--port", "0"])`` ->
``[sys.executable, "-m", "slime.engines.fleet.lifeline", "4242", "--", "python", "-m", ...]``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

__all__ = ["with_lifeline", "main"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def with_lifeline(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it is killed when this process dies (module docstring); unchanged off Linux."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-m", __name__, str(os.getpid()), "--", *argv]


def main(args: Sequence[str]) -> int:
    """``<parent pid> -- <command...>``: set the parent-death signal, then exec the command.

    Returns (only when it cannot exec): 2 for bad arguments, 1 when the parent is already gone.
    """
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -m slime.engines.fleet.lifeline PARENT_PID -- COMMAND...", file=sys.stderr)
        return 2
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        print(f"lifeline: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
    if os.getppid() != int(args[0]):  # the run died before the prctl: the signal will never come
        return 1
    command = list(args[2:])
    os.execvp(command[0], command)
    return 1  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
