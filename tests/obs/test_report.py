"""``slime report RUN_DIR`` on a finished run, a crashed one, and something that is not a run."""

from __future__ import annotations

import json

from slime.obs.plots import PLOTS
from slime.obs.report import main


def _step(s: int, **kw) -> dict:
    rec = {
        "kind": "step",
        "step": s,
        "policy_version": s,
        "reward_mean": 0.1 * s,
        "accuracy": 0.1 * s,
        "tokens_per_s": 100.0 * s,
        "generated_tokens": 50,
        "aborted_samples": 2,
        "resumed_samples": 1,
        "failed_samples": 0,
        "step_time_s": 2.0,
        "max_version_lag": s % 3,
        "off_policy_token_fraction": 0.5,
        "lag_histogram": {"0": 10, "1": 10},
        "masked_stale_tokens": 0,
        "multi_version_samples": 1,
        "max_versions_in_a_sample": 2,
        "truncated_samples": 1,
        "filtered_groups": 0,
        "dropped_stale_groups": 0,
    }
    return {**rec, **kw}


def _write_run(run, num_steps: int, *, finished: bool, truncated_tail: bool = False) -> None:
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"loop": {"mode": "april", "num_rollout": 12}}))
    lines = [{"kind": "eval", "step": 0, "policy_version": 0, "accuracy": 0.25}]
    lines += [_step(s, failed_samples=3 if s == 2 else 0) for s in range(1, num_steps + 1)]
    if finished:
        lines.append({"kind": "eval", "step": num_steps, "policy_version": num_steps, "accuracy": 0.75})
    text = "".join(json.dumps(r) + "\n" for r in lines)
    if truncated_tail:
        text += json.dumps(_step(num_steps + 1))[:40]
    (run / "metrics.jsonl").write_text(text)
    if finished:
        (run / "summary.json").write_text(
            json.dumps({"wall_time_s": 31.5, "eval_accuracy_before": 0.25, "eval_accuracy_after": 0.75})
        )


def test_report_of_a_finished_run_gives_trend_totals_and_draws_missing_plots(tmp_path, capsys):
    run = tmp_path / "run"
    _write_run(run, 12, finished=True)
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "finished, mode april" in out and "steps            12 of 12" in out and "31.5 s (summary.json)" in out
    assert "eval accuracy    0.250 -> 0.750" in out
    assert "first 5 steps 0.300 -> last 5 steps 1.000" in out
    assert "aborted 24, resumed 12" in out and "max lag 2" in out and "failed samples 3" in out
    assert all((run / name).stat().st_size > 1000 for name in PLOTS)


def test_report_of_a_crashed_run_skips_the_torn_line_and_says_what_is_missing(tmp_path, capsys):
    run = tmp_path / "run"
    _write_run(run, 3, finished=False, truncated_tail=True)
    assert main([str(run), "--json", "--no-plots"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["status"] == "incomplete" and rep["steps"] == 3 and rep["num_rollout"] == 12
    assert rep["wall_time_s"] == 6.0 and rep["wall_time_source"] == "sum of step times"
    assert rep["eval_accuracy_before"] == 0.25 and rep["eval_accuracy_after"] is None
    assert rep["reward_last_steps"] == [0.1, 0.2, 0.30000000000000004]
    assert rep["staleness"]["lag_histogram"] == {"0": 30, "1": 30}
    problems = "\n".join(rep["problems"])
    assert "metrics.jsonl:5: truncated last line" in problems and "no summary.json" in problems
    assert "3 samples FAILED" in problems
    assert not any((run / name).exists() for name in PLOTS)


def test_report_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    assert "not a run directory" in capsys.readouterr().err
