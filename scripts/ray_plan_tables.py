"""Print the ``--dry-run`` placement tables of docs/ray.md: THUDM/slime's Qwen3-4B, GLM-4.5-355B and
DeepSeek-V3 flag sets (tests/cluster/test_dry_run.py cites the scripts) on 1x8, 2x8 and 8x8 GPUs.

Usage: ``python scripts/ray_plan_tables.py [--bundles]`` (``--bundles``: one line per GPU bundle too).
"""

from __future__ import annotations

import sys

from slime.cluster.plan import ClusterShape, RunShape, plan_placement
from slime.errors import ConfigError

FLAG_SETS = {
    "Qwen3-4B": "--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate --rollout-num-gpus-per-engine 2",
    "GLM-4.5-355B": "--actor-num-nodes 8 --actor-num-gpus-per-node 8 --colocate --rollout-num-gpus-per-engine 32",
    "DeepSeek-V3": "--actor-num-nodes 16 --actor-num-gpus-per-node 8 --colocate --rollout-num-gpus-per-engine 64",
}
SHAPES = (ClusterShape(1, 8), ClusterShape(2, 8), ClusterShape(8, 8))


def main(argv: list[str]) -> int:
    bundles = "--bundles" in argv
    for name, flags in FLAG_SETS.items():
        for cluster in SHAPES:
            for label, extra in (("as written", ""), ("scaled", f" --actor-num-nodes {cluster.nodes}")):
                if extra and RunShape.from_flags((flags + extra).split()) == RunShape.from_flags(flags.split()):
                    continue  # scaling changes nothing: the flag set already has the cluster's nodes
                print(f"## {name} on {cluster.nodes}x{cluster.gpus_per_node}, {label}: {flags}{extra}")
                try:
                    print(plan_placement(RunShape.from_flags((flags + extra).split()), cluster).format(bundles=bundles))
                except ConfigError as e:
                    print(f"does not fit: {e}")
                print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
