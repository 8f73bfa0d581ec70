"""The run-folder lock (``slime.loop.run_lock``): held by a live process, refused with its pid, host and
start; dropped by the kernel when the holder dies (``kill -9``), never inherited by a child the holder
forked; taken over with a log line; one per folder within a process too.

The holders are small separate processes (``python -c``), since POSIX locks never conflict within one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slime.loop.run_lock import LOCK_NAME, RunFolderInUse, acquire_run_lock, check_run_folder_free, hold_run_folders

ROOT = Path(__file__).resolve().parents[2]

HOLD = """
import os, sys
from slime.loop.run_lock import acquire_run_lock
acquire_run_lock(sys.argv[1])
if sys.argv[2] == "fork" and os.fork() == 0:  # a child that outlives its parent (a plugin's worker)
    __import__("time").sleep(600)
    os._exit(0)
print("held", flush=True)
sys.stdin.read()
"""


def _holder(folder: Path, mode: str = "plain") -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), mode],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert (
        proc.stdout is not None and proc.stdout.readline() == "held\n"
    )  # blocks until the lock is taken (or the holder died: "")
    return proc


def test_a_live_holder_is_named_with_its_pid_host_and_start_and_its_file_is_untouched(tmp_path):
    holder = _holder(tmp_path)
    try:
        written = (tmp_path / LOCK_NAME).read_bytes()
        for refuse in (acquire_run_lock, check_run_folder_free):
            with pytest.raises(RunFolderInUse) as info:
                refuse(tmp_path, flag="--save")
            line = str(info.value)
            assert "\n" not in line and line.startswith(f"--save={str(tmp_path)!r} is in use by another live run (")
            assert f"pid {holder.pid} on host {socket.gethostname()}, started 20" in line
        assert (tmp_path / LOCK_NAME).read_bytes() == written
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holders_lock_is_taken_over_with_a_line_naming_it(tmp_path, caplog):
    holder = _holder(tmp_path)
    started = json.loads((tmp_path / LOCK_NAME).read_text())["started"]
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    check_run_folder_free(tmp_path)  # the kernel dropped the lock
    with caplog.at_level(logging.WARNING, logger="slime.loop.run_lock"):
        lock = acquire_run_lock(tmp_path)
    try:
        assert [r.getMessage() for r in caplog.records] == [
            f"--save={tmp_path}: taking over its lock from a run that is no longer live "
            f"(pid {holder.pid} on host {socket.gethostname()}, started {started})"
        ]
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_a_child_the_holder_forked_does_not_keep_the_lock_after_the_holder_is_killed(tmp_path):
    holder = _holder(tmp_path, "fork")
    children = subprocess.run(["pgrep", "-P", str(holder.pid)], capture_output=True, text=True).stdout.split()
    try:
        assert children, "the holder forked no child"
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert all(Path(f"/proc/{c}").exists() for c in children)  # the child lives on ...
        acquire_run_lock(tmp_path).release()  # ... and holds nothing
    finally:
        for c in children:
            os.kill(int(c), signal.SIGKILL)


def test_one_process_cannot_take_a_folder_twice_and_a_clean_release_leaves_nothing_to_take_over(tmp_path, caplog):
    lock = acquire_run_lock(tmp_path / "run")
    with pytest.raises(RunFolderInUse, match=r"pid \d+ on host .*, this process, started "):
        acquire_run_lock(tmp_path / "run" / ".." / "run", flag="--load")
    lock.release()
    assert (tmp_path / "run" / LOCK_NAME).read_bytes() == b""
    with caplog.at_level(logging.WARNING, logger="slime.loop.run_lock"):
        acquire_run_lock(tmp_path / "run").release()
    assert caplog.records == []


def test_hold_run_folders_holds_each_folder_once_releases_on_error_and_skips_other_torchrun_ranks(
    tmp_path, monkeypatch
):
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()  # a run to resume from
    with pytest.raises(RuntimeError, match="the run failed"):
        with hold_run_folders([("--save", a), ("--load", a), ("--load", b)]) as locks:
            assert [lock.folder for lock in locks] == [a, b]
            with pytest.raises(RunFolderInUse):
                check_run_folder_free(b)
            raise RuntimeError("the run failed")
    check_run_folder_free(a)
    check_run_folder_free(b)
    monkeypatch.setenv("RANK", "1")
    with hold_run_folders([("--save", tmp_path / "c")]) as locks:
        assert locks == [] and not (tmp_path / "c").exists()


def test_a_load_folder_is_never_created_and_a_read_only_one_is_checked_not_held(tmp_path):
    with hold_run_folders([("--save", tmp_path / "run"), ("--load", tmp_path / "missing")]) as locks:
        assert [lock.folder for lock in locks] == [tmp_path / "run"] and not (tmp_path / "missing").exists()
    if os.geteuid() != 0:
        pytest.skip("a read-only view of a folder is a read-only bind mount, which needs root")
    source, view = tmp_path / "source", tmp_path / "view"
    view.mkdir()
    holder = _holder(source)
    try:
        mounted = subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True, text=True)
        if mounted.returncode != 0:
            pytest.skip(f"cannot bind-mount here: {mounted.stderr.strip()}")
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        assert not os.access(view, os.W_OK)
        with pytest.raises(RunFolderInUse, match=rf"--load='{view}' is in use by another live run \(pid {holder.pid} "):
            with hold_run_folders([("--load", view)]):
                pass
        holder.kill()
        holder.wait()
        with hold_run_folders([("--load", view)]) as locks:
            assert locks == []
    finally:
        holder.kill()
        holder.wait()
        subprocess.run(["umount", "-l", str(view)], check=False)


def test_without_os_locks_the_holder_file_decides(tmp_path, monkeypatch, caplog):
    """A file system without record locks (``ENOLCK``, e.g. some network mounts): here ``lockf`` is made to
    say so; the holder-file rules under test are slime's own."""

    def no_locks(fd, cmd, *args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        for holder, refused in (
            (
                {"pid": sleeper.pid, "host": socket.gethostname(), "started": "s"},
                "this file system has no locks: run.lock decides)",
            ),
            ({"pid": 1, "host": "elsewhere", "started": "s"}, f"if that run is gone, delete {tmp_path / LOCK_NAME})"),
        ):
            (tmp_path / LOCK_NAME).write_text(json.dumps(holder))
            with pytest.raises(RunFolderInUse) as info:
                acquire_run_lock(tmp_path)
            assert f"pid {holder['pid']} on host {holder['host']}, started s" in str(info.value) and str(
                info.value
            ).endswith(refused)
    finally:
        sleeper.kill()
        sleeper.wait()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(), "started": "s"}))
    with caplog.at_level(logging.WARNING, logger="slime.loop.run_lock"):
        acquire_run_lock(tmp_path).release()
    assert [f"pid {sleeper.pid}" in r.getMessage() and "no longer live" in r.getMessage() for r in caplog.records] == [
        True
    ]


def test_a_holder_just_starting_is_named_as_such(tmp_path):
    """Between taking the lock and writing its pid, a holder's file is empty."""
    (tmp_path / LOCK_NAME).touch()
    code = (
        f"import fcntl, os, sys; fd = os.open({str(tmp_path / LOCK_NAME)!r}, os.O_RDWR); "
        "fcntl.lockf(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunFolderInUse, match="its pid is not written yet: it is just starting"):
            acquire_run_lock(tmp_path)
    finally:
        holder.kill()
        holder.wait()


def test_a_run_holds_its_save_load_and_an_outside_disk_weights_dir(tmp_path):
    from slime.config import Config, SyncConfig
    from slime.loop.run import run_folders

    run, other, weights = str(tmp_path / "run"), str(tmp_path / "old"), str(tmp_path / "w")
    assert run_folders(Config(run_dir=run)) == [("--save", run)]
    assert run_folders(Config(run_dir=run, load=other, sync=SyncConfig(weights_dir=weights))) == [
        ("--save", run),
        ("--load", other),
        ("weights_dir", weights),
    ]
    inside = SyncConfig(weights_dir=str(tmp_path / "run" / "weights"))
    assert run_folders(Config(run_dir=run, sync=inside)) == [("--save", run)]  # the run folder's lock covers it
    assert run_folders(Config(run_dir=run, sync=SyncConfig(method="distributed", weights_dir=weights))) == [
        ("--save", run)
    ]
