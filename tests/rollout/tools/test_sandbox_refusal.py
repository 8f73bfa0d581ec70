"""Where the machine cannot give a part of the sandbox, code execution is refused with one line naming it.

The parts (``slime/rollout/tools/isolation.py``): bwrap, an unprivileged host id, the seccomp filter
(libseccomp) and per-run cgroups. A machine lacking one is simulated by handing ``Sandbox`` what
``isolation.probe()`` would find there, or by giving the probes of ``seccomp.py`` and ``cgroup.py``
the library and the cgroup tables of such a machine; the refusal itself is the code under test.
"""

from __future__ import annotations

import dataclasses

import pytest

from slime.errors import ConfigError
from slime.rollout.tools import cgroup, isolation, run_uid, seccomp
from slime.rollout.tools import sandbox as sandbox_mod
from slime.rollout.tools.cgroup import CgroupRoot
from slime.rollout.tools.sandbox import Sandbox, SandboxUnavailable, sandbox_unavailable_reason

requires_sandbox = pytest.mark.skipif(
    sandbox_unavailable_reason() is not None, reason=f"no OS sandbox: {sandbox_unavailable_reason()}"
)

MISSING = {
    "seccomp": "libseccomp is not available (libseccomp.so.2: cannot open shared object file; as root: apt-get install libseccomp2)",
    "cgroup": "no cgroup for per-run limits: cgroup v2 /sys/fs/cgroup offers no controllers and no cgroup v1 pids hierarchy",
    "uid": "the sandbox would run as the host's root: bwrap cannot start it as nobody (bwrap: Creating new namespace failed)",
}


@pytest.mark.parametrize("part", sorted(MISSING))
def test_a_missing_part_is_refused_in_one_line_naming_it(part, monkeypatch):
    machine = isolation.Isolation(launcher=None, seccomp_bpf=None, cgroups=None, missing=(MISSING[part],))
    monkeypatch.setattr(sandbox_mod.isolation, "probe", lambda: machine)
    assert sandbox_unavailable_reason() == MISSING[part]
    with pytest.raises(SandboxUnavailable) as info:
        Sandbox()
    message = str(info.value)
    assert isinstance(info.value, ConfigError) and "\n" not in message
    assert MISSING[part] in message and "--allow-unsafe-code-execution" in message


@requires_sandbox
async def test_allowed_unsafe_runs_in_bwrap_without_the_missing_cgroup(monkeypatch):
    complete = isolation.probe()
    machine = dataclasses.replace(complete, cgroups=None, missing=(MISSING["cgroup"],))
    monkeypatch.setattr(sandbox_mod.isolation, "probe", lambda: machine)
    box = Sandbox(timeout_s=3.0, allow_unsafe=True)
    result = await box.run("import os\nprint(os.getuid(), 6 * 7)")
    assert box.isolation == "bwrap" and box.missing == (MISSING["cgroup"],)
    assert result.ok and result.stdout.endswith(" 42\n"), result.stderr
    uid = int(result.stdout.split()[0])  # as root a uid of the run's own (run_uid.py), else nobody in a user namespace
    assert uid >= run_uid.UID_BASE if box._launcher.sets_uid else uid == 65534


def test_without_libseccomp_the_filter_is_missing_with_the_package_to_install(monkeypatch):
    seccomp._build.cache_clear()
    monkeypatch.setattr(seccomp.ctypes.util, "find_library", lambda name: f"lib{name}-absent.so.9")
    try:
        reason = seccomp.filter_bpf()
    finally:
        seccomp._build.cache_clear()
    assert (
        isinstance(reason, str) and "libseccomp is not available" in reason and "apt-get install libseccomp2" in reason
    )


def test_the_filter_builds_here_or_says_why():
    bpf = seccomp.filter_bpf()
    if isinstance(bpf, str):
        pytest.skip(bpf)
    assert len(bpf) % 8 == 0 and len(bpf) // 8 > len(seccomp.DENIED)  # one 8-byte BPF instruction per rule at least


def _controllers(directory, offered: str, enabled: str = "") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.controllers").write_text(offered + "\n")
    (directory / "cgroup.subtree_control").write_text(enabled + "\n")


def test_cgroup_v2_without_controllers_and_no_v1_is_no_cgroup(tmp_path):
    _controllers(tmp_path / "job", "cpu io")
    found = cgroup._find_root({"": "/job"}, [("cgroup2", "/", str(tmp_path), {"rw"})])
    assert isinstance(found, str) and "offers cpu io" in found and "no cgroup v1 pids hierarchy" in found


def test_cgroup_v2_with_both_controllers_for_the_children_is_used(tmp_path):
    _controllers(tmp_path / "job", "cpu memory pids", "memory pids")
    found = cgroup._find_root({"": "/job"}, [("cgroup2", "/", str(tmp_path), {"rw"})])
    assert found == CgroupRoot(2, (str(tmp_path / "job"),))


def test_cgroup_v1_hierarchies_are_used_where_v2_has_no_controllers(tmp_path):
    _controllers(tmp_path / "unified", "")
    own = {"": "/", "pids": "/", "memory": "/jobs/42", "cpu": "/"}
    mounts = [
        ("cgroup2", "/", str(tmp_path / "unified"), {"rw"}),
        ("cgroup", "/", "/sys/fs/cgroup/cpu,cpuacct", {"rw", "cpu", "cpuacct"}),
        ("cgroup", "/", "/sys/fs/cgroup/pids", {"rw", "pids"}),
        ("cgroup", "/", "/sys/fs/cgroup/memory", {"rw", "memory"}),
    ]
    assert cgroup._find_root(own, mounts) == CgroupRoot(1, ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory/jobs/42"))


def test_a_cgroup_outside_the_mounted_tree_is_no_cgroup(tmp_path):
    _controllers(tmp_path, "memory pids", "memory pids")  # the mount shows /job only; we are in /other
    found = cgroup._find_root({"": "/other"}, [("cgroup2", "/job", str(tmp_path), {"rw"})])
    assert (
        isinstance(found, str)
        and "does not show this process's cgroup /other" in found
        and "no cgroup v1 pids hierarchy" in found
    )
