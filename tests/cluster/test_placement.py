"""One placement group on the local 3-node cluster: bundles sorted by node and GPU, roles in slime's order,
every actor on its bundle's node with its bundle's GPUs (conftest.py's cluster)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from slime.cluster.placement import reserve, slots_in_order, sort_key  # noqa: E402
from slime.cluster.plan import Process, RunShape  # noqa: E402
from slime.cluster.supervise import ClusterRun, Command, Rendezvous  # noqa: E402

from .conftest import GPUS_PER_NODE  # noqa: E402


def test_sort_key_orders_by_ip_then_node_then_gpu():
    probes = [
        ("b", "10.0.0.2", 1),
        ("a", "10.0.0.10", 0),
        ("b", "10.0.0.2", 0),
        ("c", "10.0.0.2", 0),
        ("a", "10.0.0.10", 1),
    ]
    slots = slots_in_order(probes)
    assert [(s.ip, s.node_id, s.gpu) for s in slots] == [
        ("10.0.0.2", "b", 0),
        ("10.0.0.2", "b", 1),
        ("10.0.0.2", "c", 0),  # same IP, another raylet: after b's GPUs, never between them
        ("10.0.0.10", "a", 0),  # numerically after .2, not as text
        ("10.0.0.10", "a", 1),
    ]
    assert [s.bundle for s in slots] == [2, 0, 3, 1, 4]
    assert [s.node for s in slots] == [0, 0, 1, 2, 2]
    assert sort_key("host-b", "x", 0) > sort_key("10.0.0.10", "x", 0)


def _report_command(out: Path):
    """Each process writes what it sees (node, GPUs, rank, rendezvous) to ``out/<name>.json`` and sleeps."""

    def command(p: Process, r: Rendezvous) -> Command:
        code = (
            "import json, os, time;"
            "keys = ('CUDA_VISIBLE_DEVICES', 'RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'LOCAL_RANK');"
            "seen = {k: os.environ.get(k) for k in keys};"
            f"open({str(out / (p.name + '.json'))!r}, 'w').write(json.dumps(seen));"
            "time.sleep(600)"
        )
        return Command((sys.executable, "-c", code))

    return command


def _seen(out: Path, names: list[str], timeout_s: float = 30.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while not all((out / f"{n}.json").exists() for n in names) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {n: json.loads((out / f"{n}.json").read_text()) for n in names}


def test_bundles_land_on_their_nodes_in_slime_order(ray_cluster, tmp_path):
    """Trainer 1 x 4 then two engines of 2 (not colocated): 8 bundles over the two GPU nodes; the trainer's
    ranks fill the first node in sorted order, GPUs 0-3; the engines the second; every actor runs on the node
    of its bundle and its child sees that bundle's GPUs (and, for trainer ranks, rank 0's rendezvous)."""
    shape = RunShape(trainer_nodes=1, trainer_gpus_per_node=4, rollout_gpus=4, gpus_per_engine=2)
    reservation = reserve(shape, cpus_per_bundle=0, timeout_s=60)
    table = reservation.table
    assert [(s.node, s.gpu) for s in table.slots] == [(n, g) for n in (0, 1) for g in range(GPUS_PER_NODE)]
    assert len({s.node_id for s in table.slots}) == 2
    trainers, engines = table.of_role("trainer"), table.of_role("engine")
    assert {table.slots[p.slots[0]].node for p in trainers} == {0}
    assert [table.gpus(p) for p in engines] == [(0, 1), (2, 3)] and {p.node for p in engines} == {1}

    with ClusterRun(reservation, _report_command(tmp_path)) as run:
        names = [p.name for p in table.processes if p.role != "router"]
        seen = _seen(tmp_path, names)
        for p in table.processes:
            if p.slots:  # the actor is on the node Ray put its bundle on
                assert run.where(p.name).node_id == table.slots[p.slots[0]].node_id, f"{p.name} on the wrong node"
        for p in trainers:
            assert seen[p.name]["CUDA_VISIBLE_DEVICES"] == str(table.slots[p.rank].gpu)
            assert (seen[p.name]["RANK"], seen[p.name]["WORLD_SIZE"], seen[p.name]["LOCAL_RANK"]) == (
                str(p.rank),
                "4",
                "0",
            )
            assert seen[p.name]["MASTER_ADDR"] == run.where("trainer-0").ip
        assert len({seen[p.name]["MASTER_PORT"] for p in trainers}) == 1
        assert [seen[p.name]["CUDA_VISIBLE_DEVICES"] for p in engines] == ["0,1", "2,3"]
        assert seen["engine-0"]["RANK"] is None  # torchrun's variables are the trainer's only


def test_a_wide_engine_spans_nodes_with_one_dist_init_addr(ray_cluster, tmp_path):
    """One engine of 8 GPUs colocated with a trainer of 2 x 4: one process per node, node rank 0's address
    as every node's ``--dist-init-addr``."""
    reservation = reserve(RunShape(2, 4, None, 8, colocate=True, router=False), cpus_per_bundle=0, timeout_s=60)
    seen: dict[str, Rendezvous] = {}

    def command(p: Process, r: Rendezvous) -> Command:
        seen[p.name] = r
        return Command((sys.executable, "-c", "import time; time.sleep(600)"))

    with ClusterRun(reservation, command) as run:
        head, other = (p for p in reservation.table.of_role("engine"))
        assert (head.nnodes, other.node_rank, head.node != other.node) == (2, 1, True)
        assert seen[head.name].dist_init == seen[other.name].dist_init
        assert seen[head.name].dist_init is not None and seen[head.name].dist_init[0] == run.where(head.name).ip
        assert seen["trainer-5"].master == seen["trainer-0"].master
