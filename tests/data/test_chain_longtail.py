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


def _sweep_run(sweep: Path, name: str, accuracies: list[float | None], rewards: list[float] | None = None) -> None:
    points = [{"step": 4 * i, "accuracy": a} for i, a in enumerate(accuracies)]
    run = sweep / name / "sync"
    run.mkdir(parents=True)
    (run / "learning.json").write_text(json.dumps({"curves": {"sync": [{"points": points}]}}))
    if rewards:  # the run's own metrics, as slime train writes them: the train steps' reward, entropy, grad norm
        steps = [
            {"step": i + 1, "train/reward_mean": r, "train/entropy": 0.1 + i / 100, "train/grad_norm": 1.0}
            for i, r in enumerate(rewards)
        ]
        (run / "runs" / "sync-s0").mkdir(parents=True)
        (run / "runs" / "sync-s0" / "metrics.jsonl").write_text(
            "".join(json.dumps(s) + "\n" for s in [{"accuracy": 0.5}, *steps])
        )


def _picker():
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    import pick_variant

    return pick_variant


def test_the_lr_sweep_picks_the_rate_with_the_best_accuracy_after_step_0(tmp_path, capsys):
    pick_variant = _picker()
    # 3e-4 has the best final eval (0.62) by noise and the worst curve; 1e-4 is best after step 0 on the mean
    _sweep_run(tmp_path, "lr3e-5", [0.55, 0.55, 0.56, 0.57])
    _sweep_run(tmp_path, "lr1e-4", [0.55, 0.60, 0.61, 0.60])
    _sweep_run(tmp_path, "lr3e-4", [0.55, 0.40, 0.45, 0.62])
    _sweep_run(tmp_path, "lr1e-3", [0.55, None, None])  # no eval after step 0: reported, never picked
    assert pick_variant.main([str(tmp_path)]) == 0
    assert (tmp_path / "best_lr").read_text().strip() == "1e-4"
    assert (tmp_path / "best_variant").read_text().strip() == "lr1e-4"
    out = capsys.readouterr().out
    assert "lr 1e-4: mean after step 0 0.603 (gain +0.053)" in out and "lr 1e-3: no eval after step 0" in out


def test_the_lr_sweep_breaks_ties_to_the_smaller_rate_and_fails_without_a_curve(tmp_path):
    pick_variant = _picker()
    assert pick_variant.main([str(tmp_path)]) == 1 and not (tmp_path / "best_variant").exists()
    _sweep_run(tmp_path, "lr1e-4", [0.5, 0.6])
    _sweep_run(tmp_path, "lr3e-5", [0.5, 0.6])
    assert pick_variant.pick(tmp_path)[0] == "lr3e-5"


def test_a_variant_sweep_picks_by_name_and_reports_each_runs_training_signals(tmp_path, capsys):
    pick_variant = _picker()
    _sweep_run(tmp_path, "control", [0.51, 0.50, 0.52], rewards=[0.5, 0.52, 0.49, 0.51])
    _sweep_run(tmp_path, "b256", [0.51, 0.58, 0.62], rewards=[0.5, 0.55, 0.6, 0.7])
    _sweep_run(tmp_path, "lr3e-5", [0.51, 0.36, 0.22], rewards=[0.53, 0.34, 0.20, 0.09])
    assert pick_variant.main([str(tmp_path)]) == 0
    assert (tmp_path / "best_variant").read_text().strip() == "b256"
    assert not (tmp_path / "best_lr").exists(), "the pick is not a rate"
    out = capsys.readouterr().out
    # the falling run's signals: reward of its first three steps 0.357 -> last three 0.210, entropy rising
    assert "4 steps: reward 0.357 -> 0.210, entropy 0.110 -> 0.120, grad norm 1.00" in out
    assert "b256: mean after step 0 0.600 (gain +0.090)" in out and "no variant raised" not in out


def test_a_sweep_where_nothing_learned_says_so_beside_its_pick(tmp_path, capsys):
    pick_variant = _picker()
    _sweep_run(tmp_path, "control", [0.51, 0.51, 0.51])
    _sweep_run(tmp_path, "lr3e-5", [0.51, 0.36, 0.22])
    assert pick_variant.main([str(tmp_path)]) == 0
    assert (tmp_path / "best_variant").read_text().strip() == "control"
    assert "no variant raised held-out accuracy over step 0; control fell least" in capsys.readouterr().out


def test_sft_rows_mix_direct_answers_at_the_share_asked_and_keep_the_problems(tmp_path):
    worked = chain.sft_rows(400, 1, **chain.GPU_SIZE)
    mixed = chain.sft_rows(400, 1, 0.5, **chain.GPU_SIZE)
    assert [r["prompt"] for r in mixed] == [r["prompt"] for r in worked], "the same problems, only the style differs"
    direct = [m for m, w in zip(mixed, worked) if m != w]
    assert 0.4 < len(direct) / 400 < 0.6
    assert all(m["response"] == "#" + chain.extract_answer(w["response"]) for m, w in zip(mixed, worked) if m != w)
    assert chain.sft_rows(400, 1, 0.5, **chain.GPU_SIZE) == mixed, "seeded"


def test_the_warm_start_writes_the_mixed_sft_rows_at_the_size_asked(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    import make_longtail_warmstart as mlw

    ns, _ = mlw.parse_args(["--out", str(tmp_path), "--max-terms", "12", "--direct-fraction", "0.25"])
    assert mlw.task_size(ns) == {**chain.GPU_SIZE, "max_terms": 12}
    # the data step alone (no model, no SFT): the run stops at the subprocess, which this test does not want
    monkeypatch.setattr(mlw.subprocess, "run", lambda *a, **k: None)
    monkeypatch.setattr(
        mlw.make_warmstart,
        "write_init",
        lambda out, *a, **k: (out.mkdir(parents=True), (out / "tokenizer_config.json").write_text("{}")),
    )
    assert (
        mlw.main(
            [
                "--out",
                str(tmp_path),
                "--steps",
                "10",
                "--batch-size",
                "20",
                "--max-terms",
                "12",
                "--direct-fraction",
                "0.25",
                "--num-train",
                "50",
            ]
        )
        == 0
    )
    sft = [json.loads(ln) for ln in (tmp_path / "data" / "sft.jsonl").read_text().splitlines()]
    train = [json.loads(ln) for ln in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    assert len(sft) == 200 and 0.1 < sum(r["response"].startswith("#") for r in sft) / 200 < 0.4
    assert max(r["prompt"].count("+") for r in sft + train) <= 11, "12 terms at most"
