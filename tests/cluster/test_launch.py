"""``slime train --ray``'s commands, checks and ``--dry-run`` (issue 28), without a cluster.

What each placed process runs (the launch plan's server commands on their node; the trainer's ranks with the
user's flags, attached to the placed engines), the weight-sync checks on a placement (``tensor`` within one
node only; ``disk`` on a path every node sees), and ``--ray --dry-run`` on THUDM/slime's own flag sets for
paths that exist only on the cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slime.cli import main
from slime.cli.args import build_parser, config_from_args, split_passthrough
from slime.cluster.commands import RAY_FLAGS, RunCommands, launch_plan_for_ray, run_shape, strip_flags
from slime.cluster.launch import check_tensor_sync, check_weights_dir_shared
from slime.cluster.placement import Reservation
from slime.cluster.plan import ClusterShape, plan_placement
from slime.cluster.supervise import Rendezvous
from slime.config import Config
from slime.engines.fleet.plan import build_launch_plan
from slime.errors import ConfigError

DATA = Path(__file__).parent.parent / "data" / "slime_scripts"


def _config(argv: list[str]) -> Config:
    own, sglang, router = split_passthrough(strip_flags(argv, RAY_FLAGS))  # the driver's own flags: its parser's
    ns = build_parser().parse_args(own)
    return config_from_args(ns, sglang_args=sglang, router_args=router).with_placement_defaults()


def _script(*names: str) -> list[str]:
    """The flags of THUDM/slime's scripts kept in tests/data/slime_scripts (one flag per line)."""
    out: list[str] = []
    for name in names:
        for line in (DATA / name).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                out += line.split()
    return out


SGLANG_RUN = [
    "--hf-checkpoint",
    "/cluster/Qwen3-4B",
    "--train-backend",
    "megatron",
    "--actor-num-gpus-per-node",
    "2",
    "--rollout-num-gpus",
    "4",
    "--rollout-num-gpus-per-engine",
    "2",
    "--sglang-mem-fraction-static",
    "0.7",
    "--save",
    "/cluster/runs/x",
]


def _table_and_commands(argv: list[str], cluster: ClusterShape):
    config = _config(argv)
    plan = launch_plan_for_ray(
        config.engine, seed=config.seed, colocate=config.sync.colocate, in_place_updates=config.updates_in_place()
    )
    table = plan_placement(run_shape(config.train, plan, colocate=config.sync.colocate), cluster)
    return config, table, RunCommands(tuple(argv), plan)


def test_servers_run_the_launch_plan_command_on_their_node_and_port():
    _, table, commands = _table_and_commands(["--ray", *SGLANG_RUN], ClusterShape(2, 4))
    engine = next(p for p in table.processes if p.name == "engine-1")
    cmd = commands(engine, Rendezvous("10.0.0.3", 41234, None, None))
    argv = list(cmd.argv)
    assert argv[argv.index("--host") + 1] == "10.0.0.3" and argv[argv.index("--port") + 1] == "41234"
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.7"  # a --sglang-* flag reaches the server
    assert "CUDA_VISIBLE_DEVICES" not in cmd.env  # the bundle's GPUs, set by ClusterRun


def test_trainer_ranks_run_the_users_flags_attached_to_the_placed_engines():
    argv = ["--ray", "--ray-address", "10.0.0.1:6379", *SGLANG_RUN]
    _, table, commands = _table_and_commands(argv, ClusterShape(2, 4))
    urls = ("http://10.0.0.3:41000", "http://10.0.0.3:41001")
    trainer = next(p for p in table.processes if p.name == "trainer-1")
    cmd = list(commands(trainer, Rendezvous("10.0.0.2", None, ("10.0.0.2", 29500), None, urls)).argv)
    assert cmd[1:4] == ["-m", "slime.cli", "train"]
    flags = cmd[4:]
    assert "--ray" not in flags and "--ray-address" not in flags  # the driver's own
    assert flags[: len(SGLANG_RUN)] == SGLANG_RUN  # the user's flags as given: the rank's config is the run's
    assert flags[len(SGLANG_RUN) :] == ["--ray-placed-engines", *(f"actor={u}" for u in urls)]
    rank = _config(flags)
    assert rank.engine.rollout_num_gpus == 4 and rank.engine.sglang_args == ("--mem-fraction-static", "0.7")
    plan = build_launch_plan(rank.engine)  # ... and it attaches to the placed engines, launching nothing
    assert plan.backend == "external" and plan.external_urls == urls and plan.servers == ()


def test_an_engine_wider_than_a_node_runs_on_each_of_its_nodes_with_sglang_multinode_flags():
    argv = ["--ray", "--hf-checkpoint", "/m", "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", "16"]
    argv += ["--rollout-num-gpus-per-engine", "16"]
    _, table, commands = _table_and_commands(argv, ClusterShape(3, 8))
    second = next(p for p in table.processes if p.name == "engine-0-node-1")
    cmd = list(commands(second, Rendezvous("10.0.0.4", None, None, ("10.0.0.3", 5000))).argv)
    assert cmd[cmd.index("--nnodes") + 1] == "2" and cmd[cmd.index("--node-rank") + 1] == "1"
    assert cmd[cmd.index("--dist-init-addr") + 1] == "10.0.0.3:5000"
    assert cmd[cmd.index("--tp-size") + 1] == "16"


def test_the_router_is_given_the_engines_real_addresses():
    argv = ["--ray", "--hf-checkpoint", "/m", "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "2"]
    _, table, commands = _table_and_commands(argv, ClusterShape(1, 4))
    router = next(p for p in table.processes if p.role == "router")
    real = ("http://10.0.0.3:41000", "http://10.0.0.3:41001")
    cmd = list(commands(router, Rendezvous("10.0.0.3", 42000, None, None, real)).argv)
    assert cmd[cmd.index("--worker-urls") + 1 :][:2] == list(real)
    assert cmd[cmd.index("--port") + 1] == "42000"
    trainer = next(p for p in table.processes if p.role == "trainer")
    rank = list(commands(trainer, Rendezvous("10.0.0.2", None, None, None, real, ("10.0.0.3", 42000))).argv)
    assert rank[-1] == "router=http://10.0.0.3:42000"
    plan = build_launch_plan(_config(rank[4:]).engine)
    assert plan.router_of("actor") is not None and plan.router_of("actor").url == "http://10.0.0.3:42000"


def test_tensor_sync_is_refused_when_an_engine_runs_on_another_node():
    argv = ["--ray", "--hf-checkpoint", "/m", "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", "8"]
    config, table, _ = _table_and_commands([*argv, "--weight-sync", "tensor"], ClusterShape(2, 8))
    with pytest.raises(ConfigError, match=r"--weight-sync tensor .* engine-0 runs on node 1 .* distributed"):
        check_tensor_sync(config.sync, table)
    config, table, _ = _table_and_commands([*argv[:-1], "2", "--weight-sync", "tensor"], ClusterShape(1, 16))
    check_tensor_sync(config.sync, table)  # one node: allowed


def test_disk_sync_needs_the_weights_dir_seen_from_every_engine_node(tmp_path):
    run_dir = tmp_path / "runs" / "x"  # not created: the probe goes beside it, the run dir stays the trainer's
    argv = ["--ray", "--hf-checkpoint", "/m", "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", "8"]
    config, table, _ = _table_and_commands([*argv, "--save", str(run_dir)], ClusterShape(2, 8))
    files: dict[int, set[Path]] = {0: set(), 1: set()}  # what each node's disk holds: nothing shared

    def probe(reservation, process, path, token):
        if token is not None:
            files[process.node].add(path)
            assert path.parent == tmp_path  # the nearest existing parent of RUN_DIR/weights
            return True
        return path in files[process.node]

    reservation = Reservation(group=None, table=table, released=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"--weight-sync disk: .*engine-0 on node 1 .* does not see"):
        check_weights_dir_shared(config.sync, config.run_dir, reservation, probe)
    assert not run_dir.exists()
    files[1] = files[0]  # one shared disk
    check_weights_dir_shared(config.sync, config.run_dir, reservation, probe)


@pytest.mark.parametrize(
    "cluster, fits", [(ClusterShape(1, 8), True), (ClusterShape(2, 8), True), (ClusterShape(8, 8), True)]
)
def test_dry_run_plans_slime_qwen3_4b_script_as_written_for_paths_on_the_cluster(cluster, fits, capsys):
    argv = _script("qwen3_4b_model.txt", "run_qwen3_4b.txt")
    assert "/root/Qwen3-4B" in argv and not Path("/root/Qwen3-4B").exists()
    plan = ["--ray-plan-nodes", str(cluster.nodes), "--ray-plan-gpus-per-node", str(cluster.gpus_per_node)]
    assert main(["train", "--ray", "--dry-run", *plan, *argv]) == 0
    out = capsys.readouterr().out
    assert "note: not on this machine, planned anyway (a real run refuses them): --hf-checkpoint /root/Qwen3-4B" in out
    assert "# slime on Ray: 8 GPU bundle(s) on 1 node(s)" in out
    assert "trainer-0 (and ranks 1-7" in out and "engine-3:" in out
    placed = " ".join(f"actor=http://node-0:{15000 + i}" for i in range(4))
    assert f"--ray-placed-engines {placed} router=http://node-0:15004" in out


@pytest.mark.parametrize(
    "name, placement, needs",
    [
        (
            "GLM-4.5-355B",
            "--actor-num-nodes 8 --actor-num-gpus-per-node 8 --colocate --rollout-num-gpus-per-engine 32",
            64,
        ),
        (
            "DeepSeek-V3",
            "--actor-num-nodes 16 --actor-num-gpus-per-node 8 --colocate --rollout-num-gpus-per-engine 64",
            128,
        ),
    ],
)
def test_dry_run_of_the_large_moe_flag_sets(name, placement, needs, capsys):
    argv = ["train", "--ray", "--dry-run", "--hf-checkpoint", f"/root/{name}", "--train-backend", "megatron"]
    argv += placement.split()
    small = main([*argv, "--ray-plan-nodes", "2", "--ray-plan-gpus-per-node", "8"])
    assert small == 2 and f"the run needs {needs} GPU bundle(s), the cluster has 16" in capsys.readouterr().err
    assert main([*argv, "--ray-plan-nodes", str(needs // 8), "--ray-plan-gpus-per-node", "8"]) == 0
    out = capsys.readouterr().out
    assert f"--nnodes {64 // 8 if needs == 128 else 4} --node-rank 1 --dist-init-addr node-0:" in out


def test_a_resumed_ray_run_places_its_engines_anew(tmp_path):
    """The saved config of a Ray run holds the last placement's engines: the driver plans without them."""
    argv = [
        "--ray",
        "--hf-checkpoint",
        "/m",
        "--rollout-num-engines",
        "2",
        "--ray-placed-engines",
        "actor=http://old:1",
    ]
    config = _config(argv)
    plan = launch_plan_for_ray(config.engine, seed=0, colocate=False, in_place_updates=False)
    assert plan.backend == "embedded" and len(plan.servers) == 2


def test_dry_run_still_refuses_a_bad_input_that_is_here(tmp_path, capsys):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"prompt": "1+1", "label": "2"}\nnot json\n')
    plan = ["--ray-plan-nodes", "1", "--ray-plan-gpus-per-node", "8"]
    assert main(["train", "--ray", "--dry-run", *plan, "--prompt-data", str(bad), "--rm-type", "math"]) == 2
    assert f"{bad}:2" in capsys.readouterr().err


def test_dry_run_needs_the_cluster_shape(capsys):
    assert main(["train", "--ray", "--dry-run"]) == 2
    assert "--ray-plan-nodes N --ray-plan-gpus-per-node G" in capsys.readouterr().err
