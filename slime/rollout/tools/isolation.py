"""What this machine gives the sandbox, probed once: bwrap, an unprivileged host id, seccomp, per-run cgroups.

The sandbox (``sandbox.py``) needs all four; ``probe().missing`` lists what is not there, one line each,
in that order, and ``Sandbox`` refuses to run code while the list is not empty unless unsafe execution
is allowed (``--allow-unsafe-code-execution``), in which case it uses whatever is there: bwrap without
seccomp or without a cgroup (``RLIMIT_NPROC`` then bounds processes per host user), bwrap as the host's
root, or, with no bwrap at all, a plain child process under an audit hook (``audit_hook.py``).

For a non-root user, per-run cgroups need a cgroup delegated to that user: the fix named is to start
slime in one, ``systemd-run --user --scope -p Delegate=yes slime ...`` (``cgroup.py`` then moves slime
into a leaf of it and makes the per-run cgroups beside it). Starting a systemd scope per run instead
(``systemd-run --user --scope`` around each bwrap) would cost a D-Bus round trip and a unit per run,
and needs a user session bus that batch jobs often lack, so it is not done.
"""

from __future__ import annotations

import dataclasses
import os

from slime.rollout.tools import bwrap, cgroup, seccomp
from slime.rollout.tools.bwrap import BwrapLauncher
from slime.rollout.tools.cgroup import CgroupRoot

__all__ = ["Isolation", "probe"]

_NO_BWRAP_FIX = "install bubblewrap (as root: apt-get install bubblewrap)"
_CGROUP_FIX = "start slime as the only process of a cgroup of its own: systemd-run --scope -p Delegate=yes slime ..."
_NON_ROOT_CGROUP_FIX = (
    "start slime inside a cgroup delegated to you: systemd-run --user --scope -p Delegate=yes slime ..."
)


@dataclasses.dataclass(frozen=True)
class Isolation:
    """The parts of the sandbox this machine has.

    Attributes:
        launcher: how to start bwrap, or None (no usable bwrap).
        seccomp_bpf: the seccomp filter (BPF), or None.
        cgroups: where per-run cgroups go, or None.
        missing: what the sandbox lacks here, one line each (empty: nothing); each line says the fix.
    """

    launcher: BwrapLauncher | None
    seccomp_bpf: bytes | None = dataclasses.field(repr=False)
    cgroups: CgroupRoot | None = None
    missing: tuple[str, ...] = ()


def probe() -> Isolation:
    """What the sandbox can have here; never raises. Each part is probed once per process (bwrap per path)."""
    missing: list[str] = []
    found_bpf = seccomp.filter_bpf()
    bpf = found_bpf if isinstance(found_bpf, bytes) else None
    found = bwrap.probe(bpf)
    if isinstance(found, str):
        return Isolation(None, None, None, (f"{found}; {_NO_BWRAP_FIX}",))
    if found.problem:
        missing.append(f"the sandbox would run as the host's root: bwrap cannot start it as nobody ({found.problem})")
    if isinstance(found_bpf, str):
        missing.append(found_bpf)
    elif "--seccomp" not in found.known_flags:
        missing.append(f"{found.bwrap} has no --seccomp option (bubblewrap 0.1.5 or later is needed)")
        bpf = None
    roots = cgroup.probe()
    if isinstance(roots, str):
        missing.append(f"{roots}; {_NON_ROOT_CGROUP_FIX if os.geteuid() != 0 else _CGROUP_FIX}")
    return Isolation(found, bpf, roots if isinstance(roots, CgroupRoot) else None, tuple(missing))
