"""``--dry-run`` placement tables for THUDM/slime's own flag sets on 1x8, 2x8 and 8x8 GPUs (no Ray, no cluster).

The flag sets, as THUDM/slime's scripts give them (the placement flags only; github.com/THUDM/slime):

- Qwen3-4B, ``scripts/run-qwen3-4B.sh``: ``--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate
  --rollout-num-gpus-per-engine 2`` (TP 2): 8 GPUs, four engines of 2;
- GLM-4.5-355B-A32B, ``scripts/run-glm4.5-355B-A32B.sh``: ``--actor-num-nodes 8 --actor-num-gpus-per-node 8
  --colocate --rollout-num-gpus-per-engine 32`` (TP 8, PP 4, CP 2, EP 16): 64 GPUs, two engines of 4 nodes;
- DeepSeek-V3 (``scripts/run-deepseek-r1.sh``, which sources ``scripts/models/deepseek-v3.sh``):
  ``--actor-num-nodes 16 --actor-num-gpus-per-node 8 --colocate --rollout-num-gpus-per-engine 64``
  (TP 8, PP 4, CP 4, EP 32): 128 GPUs, two engines of 8 nodes.

As written, a flag set fits a cluster with at least its GPUs; ``scaled`` sets ``--actor-num-nodes`` to the
cluster's nodes (what a user with that cluster would type), engine width unchanged.
"""

from __future__ import annotations

import pytest

from slime.cluster.plan import BASE_PORT, ClusterShape, RunShape, plan_placement
from slime.errors import ConfigError

FLAG_SETS = {
    "Qwen3-4B": [
        "--actor-num-nodes",
        "1",
        "--actor-num-gpus-per-node",
        "8",
        "--colocate",
        "--rollout-num-gpus-per-engine",
        "2",
    ],
    "GLM-4.5-355B": [
        "--actor-num-nodes",
        "8",
        "--actor-num-gpus-per-node",
        "8",
        "--colocate",
        "--rollout-num-gpus-per-engine",
        "32",
    ],
    "DeepSeek-V3": [
        "--actor-num-nodes",
        "16",
        "--actor-num-gpus-per-node",
        "8",
        "--colocate",
        "--rollout-num-gpus-per-engine",
        "64",
    ],
}
SHAPES = {"1x8": ClusterShape(1, 8), "2x8": ClusterShape(2, 8), "8x8": ClusterShape(8, 8)}


def scaled(argv: list[str], cluster: ClusterShape) -> list[str]:
    return [*argv, "--actor-num-nodes", str(cluster.nodes)]  # the last one wins, as with argparse


def test_flags_parse_to_the_shapes_the_scripts_describe():
    assert RunShape.from_flags(FLAG_SETS["Qwen3-4B"]) == RunShape(1, 8, None, 2, colocate=True)
    glm = RunShape.from_flags([*FLAG_SETS["GLM-4.5-355B"], "--sglang-dp-size", "4"])  # other flags ignored
    assert (glm.trainer_ranks, glm.bundles(), glm.rollout_total() // glm.gpus_per_engine) == (64, 64, 2)
    assert RunShape.from_flags(FLAG_SETS["DeepSeek-V3"]).bundles() == 128


# (flag set, shape) -> engines x nodes each, as written; None: does not fit
AS_WRITTEN = {
    ("Qwen3-4B", "1x8"): (4, 1),
    ("Qwen3-4B", "2x8"): (4, 1),
    ("Qwen3-4B", "8x8"): (4, 1),
    ("GLM-4.5-355B", "8x8"): (2, 4),
    ("DeepSeek-V3", "8x8"): None,
}


@pytest.mark.parametrize("name", FLAG_SETS)
@pytest.mark.parametrize("shape", SHAPES)
def test_flag_sets_as_written(name, shape):
    run, cluster = RunShape.from_flags(FLAG_SETS[name]), SHAPES[shape]
    want = AS_WRITTEN.get((name, shape))
    if want is None:
        with pytest.raises(
            ConfigError, match=rf"^the run needs {run.bundles()} GPU bundle\(s\), the cluster has {cluster.nodes * 8} "
        ):
            plan_placement(run, cluster)
        return
    table = plan_placement(run, cluster)
    heads = [p for p in table.of_role("engine") if p.node_rank == 0]
    assert (len(heads), heads[0].nnodes) == want
    assert [s.index for s in table.slots] == list(range(run.bundles()))
    assert [t.slots[0] for t in table.of_role("trainer")] == list(range(run.trainer_ranks))  # trainer first
    assert table.of_role("router")[0].node == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_flag_sets_scaled_to_the_cluster(shape):
    cluster = SHAPES[shape]
    qwen = plan_placement(RunShape.from_flags(scaled(FLAG_SETS["Qwen3-4B"], cluster)), cluster)
    assert len(qwen.of_role("engine")) == 4 * cluster.nodes and {len(qwen.gpus(p)) for p in qwen.of_role("engine")} == {
        2
    }
    for name, width in (("GLM-4.5-355B", 32), ("DeepSeek-V3", 64)):
        run = RunShape.from_flags(scaled(FLAG_SETS[name], cluster))
        if width > cluster.nodes * 8:
            with pytest.raises(ConfigError, match=rf"not a multiple of --rollout-num-gpus-per-engine {width}"):
                plan_placement(run, cluster)
            continue
        table = plan_placement(run, cluster)
        heads = [p for p in table.of_role("engine") if p.node_rank == 0]
        assert [(h.nnodes, h.node) for h in heads] == [(width // 8, i * width // 8) for i in range(64 // width)]


def test_the_qwen3_4b_table_on_one_node():
    text = plan_placement(RunShape.from_flags(FLAG_SETS["Qwen3-4B"]), SHAPES["1x8"]).format()
    lines = text.splitlines()
    assert lines[0].startswith(
        "# slime on Ray: 8 GPU bundle(s) on 1 node(s); trainer 1 node(s) x 8 GPU(s); 4 engine(s) of 2 GPU(s)"
    )
    assert lines[2].split() == ["0", "0", "node-0", "0", "trainer-0,", "engine-0"]
    assert f"http :{BASE_PORT + 3}" in next(x for x in lines if x.startswith("engine-3"))
    assert next(x for x in lines if x.startswith("trainer-")).split() == [
        "trainer-0..7",
        "0",
        "node-0",
        "0-7",
        "rendezvous",
        ":29500",
        "(rank",
        "0)",
    ]
    assert next(x for x in lines if x.startswith("engine-1 ")).split()[:4] == ["engine-1", "0", "node-0", "2-3"]


def test_a_wide_engine_prints_its_dist_init_addr():
    table = plan_placement(RunShape.from_flags(FLAG_SETS["GLM-4.5-355B"]), SHAPES["8x8"])
    line = next(x for x in table.format().splitlines() if x.startswith("engine-1-node-3 "))
    assert line.split()[:2] == ["engine-1-node-3", "7"]
    assert line.endswith(f"--nnodes 4 --node-rank 3 --dist-init-addr node-4:{BASE_PORT + 1}")


def test_an_engine_may_not_straddle_nodes():
    with pytest.raises(ConfigError, match=r"^engine 0 \(8 GPUs\) would straddle nodes \[0, 1\]"):
        plan_placement(RunShape(1, 4, 8, 8), ClusterShape(2, 8))
    with pytest.raises(ConfigError, match=r"^engine 0 \(2 GPUs\) would straddle nodes \[0, 1\] \(\[1, 1\] GPUs each\)"):
        plan_placement(RunShape(1, 1, 2, 2), ClusterShape(2, 2))
    with pytest.raises(ConfigError, match=r"--rollout-num-gpus is needed without --colocate"):
        plan_placement(RunShape(1, 8), ClusterShape(2, 8))
