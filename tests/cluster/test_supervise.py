"""Faults and release on the local 3-node cluster: a SIGKILLed engine (its process, or its actor) comes back
on its bundle; a dead trainer rank is one line; nothing is left after exit, SIGTERM or Ctrl-C."""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.request

import pytest

ray = pytest.importorskip("ray")

from ray.util import placement_group_table  # noqa: E402

from slime.cluster.placement import reserve  # noqa: E402
from slime.cluster.plan import Process, RunShape  # noqa: E402
from slime.cluster.supervise import ClusterRun, Command, ProcessDied, Rendezvous  # noqa: E402
from slime.stop import Stopped, clear  # noqa: E402

from .conftest import wait_gone  # noqa: E402

SHAPE = RunShape(trainer_nodes=1, trainer_gpus_per_node=2, rollout_gpus=2, gpus_per_engine=1, router=False)


def serve(p: Process, r: Rendezvous) -> Command:
    """Engines serve HTTP on their port (a stand-in for SGLang); trainer ranks sleep."""
    if p.role == "engine":
        return Command((sys.executable, "-m", "http.server", str(r.port), "--bind", r.ip))
    return Command((sys.executable, "-c", "import time; time.sleep(600)"))


def get(url: str, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.status
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("target", ["process", "actor"])
def test_an_engine_killed_with_sigkill_is_restarted_on_its_bundle(ray_cluster, target):
    with ClusterRun(reserve(SHAPE, cpus_per_bundle=0, timeout_s=60), serve) as run:
        url = run.engine_urls()[1]
        assert get(url) == 200
        before, where = run.pids()["engine-1"], run.where("engine-1")
        assert before is not None
        os.kill(before if target == "process" else where.pid, signal.SIGKILL)
        assert wait_gone([before]) == []  # the actor's death takes its child along (lifeline)
        assert run.check() == ["engine-1"]
        assert run.restarts == {1: 1}
        assert run.pids()["engine-1"] != before
        assert run.where("engine-1").node_id == where.node_id  # the same bundle, so the same node
        assert run.engine_urls()[1] == url and get(url) == 200  # the same address: the router's list holds
        assert run.check() == []


def test_an_engine_out_of_restarts_ends_the_run(ray_cluster):
    with ClusterRun(reserve(SHAPE, cpus_per_bundle=0, timeout_s=60), serve, max_restarts=0) as run:
        os.kill(run.pids()["engine-0"] or 0, signal.SIGKILL)
        wait_gone([run.pids()["engine-0"] or 0])
        with pytest.raises(ProcessDied, match=r"^engine 0 .* restarted 0 time\(s\) already, giving up$"):
            run.check()


@pytest.mark.parametrize("target", ["process", "actor"])
def test_a_dead_trainer_rank_is_one_line_naming_node_and_actor(ray_cluster, target):
    with ClusterRun(reserve(SHAPE, cpus_per_bundle=0, timeout_s=60), serve) as run:
        pid, where = run.pids()["trainer-1"], run.where("trainer-1")
        os.kill((pid or 0) if target == "process" else where.pid, signal.SIGKILL)
        wait_gone([pid or 0])
        with pytest.raises(ProcessDied) as died:
            run.check()
    line = str(died.value)
    assert "\n" not in line
    why = "exit status -9" if target == "process" else "its actor died (ActorDiedError)"
    assert (
        line
        == f"trainer rank 1 (actor trainer-1, pid {pid}) on node 0 ({where.ip}, node id {where.node_id[:12]}) died: {why}"
    )


@pytest.mark.parametrize("how", ["exit", "error", "sigterm", "ctrl-c"])
def test_everything_is_released_at_exit(ray_cluster, how):
    """After the ``with``: every child and actor process gone, the placement group removed, the driver's
    SIGTERM handler what it was (``slime.stop.sigterm_raises`` only while the run lives)."""
    handler = signal.getsignal(signal.SIGTERM)
    reservation = reserve(SHAPE, cpus_per_bundle=0, timeout_s=60)
    pids: list[int] = []
    raised = {"exit": None, "error": RuntimeError, "sigterm": Stopped, "ctrl-c": KeyboardInterrupt}[how]
    try:
        with ClusterRun(reservation, serve) as run:
            pids = [pid for pid in run.pids().values() if pid] + [run.where(n).pid for n in run.pids()]
            assert len(pids) == 8
            if how in ("sigterm", "ctrl-c"):
                os.kill(os.getpid(), signal.SIGTERM if how == "sigterm" else signal.SIGINT)
                time.sleep(5)  # the handler raises Stopped (SIGTERM) or KeyboardInterrupt (SIGINT) here
            elif raised is not None:
                raise raised("stop")
    except BaseException as e:
        assert raised is not None and isinstance(e, raised), e
    finally:
        clear()
    assert wait_gone(pids) == []
    assert placement_group_table(reservation.group)["state"] == "REMOVED"
    assert signal.getsignal(signal.SIGTERM) == handler


def test_slime_trains_sigterm_handler_is_kept_and_any_other_replaced_for_the_run():
    """Under ``slime train`` (slime.stop's handler installed) the run keeps it; elsewhere (SIG_DFL, or
    ``ray.init``'s ``sys.exit``) ``sigterm_raises`` is installed for the run's life, the old one back after."""
    from slime.cluster.placement import Reservation
    from slime.cluster.plan import PlacementTable
    from slime.stop import sigterm_raises

    nothing = Reservation(group=None, table=PlacementTable(SHAPE, (), ()), released=True)  # type: ignore[arg-type]
    with sigterm_raises():
        slimes = signal.getsignal(signal.SIGTERM)
        with ClusterRun(nothing, serve):
            assert signal.getsignal(signal.SIGTERM) is slimes
    before = signal.getsignal(signal.SIGTERM)
    with ClusterRun(nothing, serve):
        assert getattr(signal.getsignal(signal.SIGTERM), "__module__", None) == "slime.stop"
    assert signal.getsignal(signal.SIGTERM) is before
