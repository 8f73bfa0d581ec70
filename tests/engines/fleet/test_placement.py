"""THUDM/slime's placement flags: the per-node plan of trainer ranks and SGLang servers (slime/engines/fleet/placement.py)."""

from __future__ import annotations

import argparse
import shlex

import pytest

from slime.cli import main, preflight
from slime.cli.args import build_parser, config_from_args
from slime.engines.fleet.host import trainer_gpus
from slime.engines.fleet.placement import build_placement, check_torchrun_env
from slime.errors import ConfigError


def config_of(*argv: str):
    ns = build_parser(argparse.ArgumentParser()).parse_args(["--hf-checkpoint", "/m", *argv])
    return config_from_args(ns).with_placement_defaults()


def placement_of(config, **kw):
    """``build_placement`` of a config's sections, as ``slime train`` calls it."""
    return build_placement(
        config.train, config.engine, colocate=config.sync.colocate, rollout_only=config.debug.debug_rollout_only, **kw
    )


MEGATRON = ("--train-backend", "megatron")


def test_two_trainer_nodes_with_servers_after_their_gpus():
    p = placement_of(
        config_of(
            *MEGATRON,
            "--actor-num-nodes",
            "2",
            "--actor-num-gpus-per-node",
            "4",
            "--rollout-num-gpus",
            "8",
            "--rollout-num-gpus-per-engine",
            "2",
        ),
        gpus_per_node=8,
    )
    assert [(n.node_rank, n.trainer_gpus, n.servers) for n in p.nodes] == [
        (0, (0, 1, 2, 3), ((4, 5), (6, 7))),
        (1, (0, 1, 2, 3), ((4, 5), (6, 7))),
    ]
    assert p.servers_off_node0
    torchruns = [line.split() for line in p.format().splitlines() if "torchrun" in line]
    assert [t[t.index("--node-rank") + 1] for t in torchruns] == ["0", "1"]
    assert all(t[t.index("--nnodes") + 1] == "2" and t[t.index("--nproc-per-node") + 1] == "4" for t in torchruns)
    assert all("$MASTER_ADDR" in t and "$MASTER_PORT" in t for t in torchruns)


def test_full_trainer_nodes_put_the_servers_on_the_next_node():
    p = placement_of(
        config_of(*MEGATRON, "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", "8"),
        gpus_per_node=8,
    )
    assert [(n.trainer_gpus, len(n.servers)) for n in p.nodes] == [((0, 1, 2, 3, 4, 5, 6, 7), 0), ((), 8)]


def test_colocate_defaults_the_rollout_gpus_to_the_actors_as_slime_does():
    config = config_of(
        *MEGATRON,
        "--actor-num-nodes",
        "1",
        "--actor-num-gpus-per-node",
        "4",
        "--colocate",
        "--rollout-num-gpus-per-engine",
        "2",
    )
    assert config.engine.rollout_num_gpus == 4 and trainer_gpus(config.train) == 4
    (node,) = placement_of(config, gpus_per_node=8).nodes
    assert node.trainer_gpus == (0, 1, 2, 3) and node.servers == ((0, 1), (2, 3))


def test_without_placement_flags_nothing_is_derived():
    config = config_of("--colocate")
    assert config.with_placement_defaults() is config and config.engine.rollout_num_gpus is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            (*MEGATRON, "--actor-num-gpus-per-node", "6", "--tensor-model-parallel-size", "4"),
            "= 4 must divide --actor-num-nodes=1 x --actor-num-gpus-per-node=6 = 6",
        ),
        (("--actor-num-nodes", "2"), "--actor-num-nodes=2: several trainer nodes need --train-backend megatron"),
        ((*MEGATRON, "--actor-num-gpus-per-node", "16"), "--actor-num-gpus-per-node=16 but a node has 8 GPU(s)"),
        (
            (
                *MEGATRON,
                "--actor-num-gpus-per-node",
                "6",
                "--rollout-num-gpus",
                "4",
                "--rollout-num-gpus-per-engine",
                "4",
            ),
            "server 0 would take GPUs",
        ),
        (
            (
                *MEGATRON,
                "--actor-num-gpus-per-node",
                "2",
                "--rollout-num-gpus",
                "3",
                "--rollout-num-gpus-per-engine",
                "2",
            ),
            "--rollout-num-gpus=3 must be a multiple of --rollout-num-gpus-per-engine=2",
        ),
    ],
    ids=["tp-pp-cp", "torch-nodes", "node-size", "span", "multiple"],
)
def test_a_placement_that_does_not_fit_is_one_line_naming_the_flags(argv, message):
    with pytest.raises(ConfigError, match=None) as exc:
        placement_of(config_of(*argv), gpus_per_node=8)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_torchrun_ranks_must_match_the_placement_flags():
    config = config_of(*MEGATRON, "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4")
    check_torchrun_env(config.train, config.engine, {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
    check_torchrun_env(config.train, config.engine, {})  # not under torchrun: a single process
    with pytest.raises(ConfigError, match="--actor-num-gpus-per-node=4 but torchrun started 2"):
        check_torchrun_env(config.train, config.engine, {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="WORLD_SIZE is 4"):
        check_torchrun_env(config.train, config.engine, {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"})


def test_dry_run_prints_each_nodes_torchrun_and_gpus(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    assert (
        main(
            [
                "train",
                "--dry-run",
                "--hf-checkpoint",
                "/m",
                *MEGATRON,
                "--actor-num-nodes",
                "2",
                "--actor-num-gpus-per-node",
                "8",
                "--tensor-model-parallel-size",
                "2",
                "--rollout-num-gpus",
                "8",
                "--rollout-num-gpus-per-engine",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "[node 0] trainer GPUs 0,1,2,3,4,5,6,7; SGLang servers none" in out
    assert "[node 1] trainer GPUs 0,1,2,3,4,5,6,7; SGLang servers none" in out
    assert "[node 2] trainer GPUs none; SGLang servers [0,1,2,3] [4,5,6,7]" in out
    assert out.count("torchrun --nnodes 2 --nproc-per-node 8") == 2
    assert "# slime launch plan" not in out  # node 0 launches none: no launch plan of node 0 to print


def test_dry_run_on_one_node_launches_servers_after_the_trainer(capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert (
        main(
            [
                "train",
                "--dry-run",
                "--hf-checkpoint",
                "/m",
                *MEGATRON,
                "--actor-num-nodes",
                "1",
                "--actor-num-gpus-per-node",
                "4",
                "--rollout-num-gpus",
                "4",
                "--rollout-num-gpus-per-engine",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "[node 0] trainer GPUs 0,1,2,3; SGLang servers [4,5] [6,7]" in out
    servers = [shlex.split(line)[0] for line in out.splitlines() if "sglang.launch_server" in line]
    assert servers == [
        "CUDA_VISIBLE_DEVICES=4,5",
        "CUDA_VISIBLE_DEVICES=6,7",
    ]  # the launch plan agrees with the placement


def test_a_run_refuses_servers_on_other_nodes_than_rank_0s(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    config = config_of(*MEGATRON, "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", "8")
    with pytest.raises(ConfigError, match="SGLang servers on nodes other than rank 0's"):
        preflight(config)


def test_sglang_config_groups_are_placed_in_order_with_their_own_sizes(tmp_path):
    path = tmp_path / "sglang.yaml"
    path.write_text(
        "groups:\n  - {name: big, num_engines: 1, gpus_per_engine: 4}\n  - {name: small, num_engines: 2, gpus_per_engine: 1}\n"
    )
    p = placement_of(
        config_of(*MEGATRON, "--actor-num-gpus-per-node", "2", "--sglang-config", str(path)), gpus_per_node=8
    )
    (node,) = p.nodes
    assert node.trainer_gpus == (0, 1) and node.servers == ((2, 3, 4, 5), (6,), (7,))


def test_rollout_num_gpus_per_node_is_the_node_size_of_the_plan(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    p = placement_of(
        config_of("--rollout-num-gpus-per-node", "4", "--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "2")
    )
    assert p.gpus_per_node == 4 and [n.servers for n in p.nodes] == [((0, 1), (2, 3)), ((0, 1), (2, 3))]
    assert (
        config_of("--rollout-num-gpus-per-node", "4", "--colocate").engine.rollout_num_gpus is None
    )  # no actor flags: nothing derived
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(
        ConfigError, match=r"^--rollout-num-gpus-per-node=4 but this node sees 2 GPU\(s\) \(CUDA_VISIBLE_DEVICES=0,1\)$"
    ):
        placement_of(config_of("--rollout-num-gpus-per-node", "4"))


def test_dry_run_prints_the_plan_of_rollout_num_gpus_per_node(monkeypatch, capsys):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert (
        main(
            [
                "train",
                "--dry-run",
                "--hf-checkpoint",
                "/m",
                "--rollout-num-gpus-per-node",
                "4",
                "--rollout-num-gpus",
                "4",
            ]
        )
        == 0
    )
    assert "node(s) of 4 GPU(s)" in capsys.readouterr().out
