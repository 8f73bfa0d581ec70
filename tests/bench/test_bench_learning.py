"""``slime bench learning``: the curve and summary arithmetic, the flags, and one tiny real run."""

import json

import pytest

from slime.bench import learning
from slime.cli import main as cli_main


def _records(*, evals, steps):
    """evals: (step, accuracy, time_s, eval_time_s); steps: (step, trained_tokens, lag_histogram)."""
    recs = [{"kind": "eval", "step": s, "accuracy": a, "time_s": t, "eval_time_s": e} for s, a, t, e in evals]
    recs += [
        {"kind": "step", "step": s, "trained_tokens": n, "lag_histogram": {str(k): v for k, v in h.items()}}
        for s, n, h in steps
    ]
    return sorted(recs, key=lambda r: (r["step"], r["kind"] == "eval"))


def test_run_curve_times_tokens_and_lags():
    recs = _records(
        evals=[(0, 0.2, 10.0, 2.0), (2, 0.5, 16.0, 1.0), (4, 0.7, 23.0, 1.0), (6, 0.65, 30.0, 2.0)],
        steps=[
            (1, 100, {0: 100}),
            (2, 100, {0: 50, 1: 50}),
            (3, 100, {1: 100}),
            (4, 100, {0: 60, 3: 40}),
            (5, 100, {0: 100}),
            (6, 100, {0: 100}),
        ],
    )
    c = learning.run_curve(recs, target=0.6)
    # training starts at the end of the step-0 eval (t=10); an eval's point is when it began
    assert [p["wall_s"] for p in c["points"]] == [0.0, 5.0, 12.0, 18.0]
    assert [p["wall_ex_eval_s"] for p in c["points"]] == [0.0, 5.0, 11.0, 16.0]  # less the mid-run evals before it
    assert [p["trained_tokens"] for p in c["points"]] == [0.0, 200.0, 400.0, 600.0]
    assert (c["time_to_target_s"], c["time_to_target_ex_eval_s"], c["tokens_to_target"], c["step_to_target"]) == (
        12.0,
        11.0,
        400.0,
        4,
    )
    assert (c["initial_accuracy"], c["final_accuracy"], c["eval_time_s"]) == (0.2, 0.65, 2.0)
    assert c["off_policy_token_share"] == pytest.approx(190 / 600)
    assert c["lag_share"] == pytest.approx({"0": 410 / 600, "1": 150 / 600, "3": 40 / 600})
    assert (c["lag_p50"], c["lag_p90"], c["lag_max"]) == (0, 1, 3)


def test_run_curve_never_reached_and_old_records():
    recs = _records(evals=[(0, 0.1, 1.0, 0.5), (2, 0.3, 4.0, 0.5)], steps=[(1, 10, {0: 10}), (2, 10, {0: 10})])
    c = learning.run_curve(recs, target=0.9)
    assert c["time_to_target_s"] is None and c["tokens_to_target"] is None and c["off_policy_token_share"] == 0.0
    with pytest.raises(ValueError, match="no timed eval before RL"):
        learning.run_curve([{"kind": "eval", "step": 0, "accuracy": 0.1}], target=0.5)


def _curve(t, acc, tokens=100.0):
    return {
        "time_to_target_s": t,
        "time_to_target_ex_eval_s": None if t is None else t - 1,
        "tokens_to_target": None if t is None else tokens,
        "final_accuracy": acc,
        "initial_accuracy": 0.2,
        "off_policy_token_share": 0.0,
        "train_wall_s": 50.0,
        "train_wall_ex_eval_s": 45.0,
        "eval_time_s": 5.0,
        "trained_tokens": 1000.0,
        "lag_p90": 0,
        "lag_max": 1,
    }


def test_summarize_spread_and_speedup():
    s = learning.summarize(
        {"sync": [_curve(30.0, 0.70), _curve(50.0, 0.74)], "async": [_curve(20.0, 0.69), _curve(None, 0.71)]}
    )
    assert s["sync"]["reached"] == 2 and s["async"]["reached"] == 1
    assert s["sync"]["final_accuracy"]["mean"] == pytest.approx(0.72) and s["sync"]["final_accuracy"][
        "std"
    ] == pytest.approx(0.02828, abs=1e-4)
    assert s["async"]["speedup_vs_sync"] == pytest.approx(40.0 / 20.0)
    assert s["async"]["speedup_vs_sync_ex_eval"] == pytest.approx(39.0 / 19.0)
    assert s["async"]["final_accuracy_vs_sync_points"] == pytest.approx(-2.0)
    table = learning.format_table(s, 0.6)
    assert table.splitlines()[2].startswith("sync") and "1/2" in table.splitlines()[3]


def test_plot_writes_png(tmp_path):
    pts = [
        {"accuracy": a, "wall_s": t, "wall_ex_eval_s": t, "trained_tokens": 10 * t}
        for t, a in ((0, 0.2), (5, 0.5), (10, 0.7))
    ]
    learning.plot({"sync": [{"points": pts}, {"points": pts[:2]}], "async": [{"points": pts}]}, tmp_path / "p.png", 0.6)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--modes", "sync,bogus"], "--modes="),
        (["--seeds", "0,x"], "--seeds="),
        (["--target-accuracy", "1.5"], "--target-accuracy="),
        (["--", "--rollout-mode", "sync"], "--rollout-mode: set by the bench"),
    ],
)
def test_bad_flags_are_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        learning.main(args, train=lambda argv: [])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_failed_run_is_one_line(tmp_path, capsys):
    code = cli_main(
        [
            "bench",
            "learning",
            "--modes",
            "sync",
            "--seeds",
            "0",
            "--out",
            str(tmp_path),
            "--",
            "--rollout-batch-size",
            "0",
        ]
    )
    assert code == 2 and capsys.readouterr().err.startswith("slime bench learning: error: ")


def test_tiny_real_bench(tmp_path):
    """Two modes, one seed, two steps through the real driver and embedded engine: every output is written."""
    code = cli_main(
        [
            "bench",
            "learning",
            "--modes",
            "sync,async-tis",
            "--seeds",
            "0",
            "--num-rollout",
            "2",
            "--eval-interval",
            "1",
            "--target-accuracy",
            "0.01",
            "--out",
            str(tmp_path),
            "--",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--global-batch-size",
            "4",
            "--num-eval-prompts",
            "4",
            "--rollout-max-response-len",
            "96",
        ]
    )
    assert code == 0
    results = json.loads((tmp_path / "learning.json").read_text())
    assert set(results["summary"]) == {"sync", "async-tis"}
    for mode in ("sync", "async-tis"):
        (curve,) = results["curves"][mode]
        assert [p["step"] for p in curve["points"]] == [0, 1, 2]
        assert curve["trained_tokens"] > 0 and curve["points"][-1]["wall_s"] > 0
        assert (
            "--use-tis" in results["argv"][mode][0]
            if mode == "async-tis"
            else "--use-tis" not in results["argv"][mode][0]
        )
    assert results["curves"]["sync"][0]["off_policy_token_share"] == 0.0
    assert (tmp_path / "learning.png").stat().st_size > 0 and (tmp_path / "learning.txt").read_text().startswith("mode")
    assert (tmp_path / "runs" / "sync-s0" / "metrics.jsonl").is_file()


def test_extra_flags_override_the_bench_defaults_and_modes_set_their_own():
    import argparse

    from slime.cli.args import build_parser, config_from_args

    argv = learning.train_argv(
        "async-mis", 3, "/tmp/x", task="chain", num_rollout=5, eval_interval=2, extra=["--num-eval-prompts", "7"]
    )
    config = config_from_args(build_parser(argparse.ArgumentParser()).parse_args(argv))
    assert (config.data.num_eval_prompts, config.loop.rollout_batch_size, config.loop.mode, config.train.mis_level) == (
        7,
        8,
        "async",
        "token",
    )
    assert (config.seed, config.loop.num_rollout, config.loop.eval_interval, config.data.builtin_task) == (
        3,
        5,
        2,
        "chain",
    )


def test_bench_usage_names_both_benches(capsys):
    assert cli_main(["bench", "nope"]) == 2
    assert "slime bench {rollout,learning}" in capsys.readouterr().err


def _bench_file(tmp_path, name, curves, **over):
    results = learning._results(
        curves,
        {m: [["--x"]] * len(r) for m, r in curves.items()},
        task="chain",
        num_rollout=6,
        eval_interval=2,
        target=0.6,
        seeds=[0],
        extra=[],
        bench_wall_s=3.0,
    )
    results.update(over)
    (tmp_path / name).mkdir()
    learning.write_results(results, tmp_path / name)
    return tmp_path / name / "learning.json"


def test_merge_joins_per_mode_benches_and_refuses_ones_that_do_not_compare(tmp_path, capsys):
    recs = _records(evals=[(0, 0.2, 10.0, 2.0), (2, 0.7, 16.0, 1.0)], steps=[(1, 100, {0: 100}), (2, 100, {1: 100})])
    run = {"seed": 0, **learning.run_curve(recs, target=0.6)}
    a = _bench_file(tmp_path, "a", {"async": [run]})
    s = _bench_file(tmp_path, "s", {"sync": [run]})
    assert cli_main(["bench", "learning", "--merge", str(a), str(s), "--out", str(tmp_path / "m")]) == 0
    merged = json.loads((tmp_path / "m" / "learning.json").read_text())
    assert list(merged["summary"]) == ["sync", "async"]  # the bench's own mode order
    assert merged["summary"]["async"]["speedup_vs_sync"] == pytest.approx(1.0) and merged["meta"]["bench_wall_s"] == 6.0
    assert (tmp_path / "m" / "learning.png").is_file() and "sync" in capsys.readouterr().out
    other = _bench_file(tmp_path, "o", {"april": [run]}, target_accuracy=0.9)
    assert cli_main(["bench", "learning", "--merge", str(s), str(other), "--out", str(tmp_path / "m2")]) == 2
    assert "differ in target_accuracy" in capsys.readouterr().err
    lr = _bench_file(tmp_path, "lr", {"april": [run]}, extra_flags=["--lr", "0.5"])
    with pytest.raises(ValueError, match="differ in extra_flags"):
        learning.merge_results([s, lr])
    with pytest.raises(ValueError, match="seed 0 is in another file"):
        learning.merge_results([s, s])
    with pytest.raises(ValueError, match="not a readable learning.json"):
        learning.merge_results([tmp_path / "missing.json"])


def test_a_bench_cut_short_keeps_the_runs_it_finished(tmp_path, monkeypatch):
    recs = _records(evals=[(0, 0.2, 10.0, 2.0), (2, 0.7, 16.0, 1.0)], steps=[(1, 100, {0: 100}), (2, 100, {0: 100})])
    calls = []

    def one_run(argv):
        calls.append(argv)
        if len(calls) == 2:
            raise KeyboardInterrupt  # e.g. the device's time limit
        return recs

    with pytest.raises(KeyboardInterrupt):
        learning.run_bench(
            ["sync", "async"],
            [0],
            tmp_path,
            task="chain",
            num_rollout=2,
            eval_interval=2,
            target=0.6,
            train=one_run,
            log=lambda _: None,
        )
    results = json.loads((tmp_path / "learning.json").read_text())
    assert list(results["curves"]) == ["sync"] and results["summary"]["sync"]["reached"] == 1
