"""Issue 30 item 4: the GPU-sized addition chains (``slime.data.chain.GPU_SIZE``) and the CPU-runnable parts of
``scripts/gpu/bench_learning_longtail.sh`` (the task files, the warm start's SFT command)."""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path

from slime.data import chain

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_size_has_a_long_tail_within_2048_positions():
    rng = random.Random(0)
    problems = [chain.make_problem(rng, **chain.GPU_SIZE) for _ in range(3000)]
    lengths = sorted(len(solution) for _, _, solution in problems)
    assert statistics.median(lengths) < 150 and lengths[int(0.9 * len(lengths))] > 600 and lengths[-1] > 1200
    assert max(len(p) + len(s) for p, _, s in problems) + 1 <= 2048
    assert all(chain.score(s, label) == 1.0 for _, label, s in problems[:50])  # the worked solution is right


def test_the_data_module_writes_rl_and_sft_rows_of_the_gpu_size(tmp_path):
    assert (
        chain.main(["--out", str(tmp_path), "--size", "gpu", "--num-train", "20", "--num-eval", "5", "--sft", "7"]) == 0
    )
    train = [json.loads(ln) for ln in (tmp_path / "train.jsonl").read_text().splitlines()]
    sft = [json.loads(ln) for ln in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert len(train) == 20 and set(train[0]) == {"prompt", "label"}
    assert len(sft) == 7 and all(r["response"].endswith("#" + chain.extract_answer(r["response"])) for r in sft)
    assert max(r["prompt"].count("+") for r in train + sft) > 9, "more terms than the CPU task's 10"


def test_the_warm_start_sft_command_trains_the_sft_rows_from_the_init(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    import make_longtail_warmstart as mlw

    ns, extra = mlw.parse_args(["--out", str(tmp_path), "--steps", "5", "--", "--train-backend", "torch"])
    cmd = mlw.sft_command(ns, tmp_path / "init", tmp_path / "data", tmp_path / "sft", extra)
    flag = {a: b for a, b in zip(cmd, cmd[1:])}
    assert cmd[cmd.index("-m") + 1 : cmd.index("-m") + 3] == ["slime.cli", "train"]
    assert flag["--loss-type"] == "sft_loss" and flag["--num-rollout"] == "5"
    assert flag["--prompt-data"] == str(tmp_path / "data" / "sft.jsonl") and flag["--hf-checkpoint"] == str(
        tmp_path / "init"
    )
    assert cmd[-2:] == ["--train-backend", "torch"] and cmd.count("--micro-batch-size") == 2
    assert flag["--micro-batch-size"] == "16", "ours after the recipe's 64: the last one wins, 16 rows a forward"
