"""Step lines with and without a terminal, and the end-of-run PNGs (complete, partial and old records)."""

from __future__ import annotations

import io
import json

from slime.obs.plots import PLOTS, write_plots
from slime.obs.progress import StepProgress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _record(step: int) -> dict:
    return {
        "kind": "step",
        "step": step,
        "reward_mean": 0.1 * step,
        "accuracy": 0.05 * step,
        "tokens_per_s": 100.0 * step,
    }


def test_without_a_terminal_each_step_is_one_plain_line():
    out = io.StringIO()
    p = StepProgress(3, stream=out)
    assert not p.uses_bar
    p.step("step 1 line", _record(1))
    p.note("eval line")
    p.close()
    assert out.getvalue() == "step 1 line\neval line\n"


def test_no_progress_keeps_plain_lines_even_on_a_terminal():
    out = _Tty()
    p = StepProgress(3, enabled=False, stream=out)
    p.step("step 1 line", _record(1))
    assert not p.uses_bar and out.getvalue() == "step 1 line\n"


def test_on_a_terminal_a_rich_bar_shows_steps_reward_and_tokens_per_s():
    out = _Tty()
    p = StepProgress(2, stream=out)
    assert p.uses_bar
    p.step("step 1 line", _record(1))
    p.step("step 2 line", _record(2))
    p.close()
    p.close()
    text = out.getvalue()
    assert "step 1 line" in text and "step 2 line" in text
    assert "2/2" in text and "reward 0.200" in text and "tok/s 200" in text


def _run_records(num_steps: int = 6) -> list[dict]:
    records = [{"kind": "eval", "step": 0, "accuracy": 0.2, "mean_response_len": 12.0}]
    for s in range(1, num_steps + 1):
        records.append(
            {
                "kind": "step",
                "step": s,
                "reward_mean": 0.1 * s,
                "accuracy": 0.08 * s,
                "response_len_mean": 20.0 + s,
                "num_samples": 16,
                "truncated_samples": s % 3,
                "tokens_per_s": 900.0 + s,
                "rollout_wait_s": 1.0,
                "train_time_s": 0.5,
                "weight_sync_s": 0.1,
                "off_policy_token_fraction": 0.1 * (s % 4),
                "multi_version_samples": s % 2,
                "lag_histogram": {"0": 100, "1": 10 * s, "6": 1},
            }
        )
    records.append({"kind": "eval", "step": num_steps, "accuracy": 0.6, "mean_response_len": 14.0})
    # what a run writes goes through JSON, which turns lag keys into strings
    return json.loads(json.dumps(records))


def test_every_end_of_run_png_is_written(tmp_path):
    written = write_plots(_run_records(), tmp_path)
    assert sorted(p.name for p in written) == sorted(PLOTS)
    assert {"reward_curve.png", "reward.png", "response_length.png", "staleness.png", "engine_busy.png"} == set(PLOTS)
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_plots_tolerate_records_with_keys_missing_and_keep_existing_files(tmp_path):
    (tmp_path / "reward.png").write_bytes(b"keep")
    written = write_plots(
        [{"kind": "step", "step": 1}, {"kind": "step"}, {"kind": "eval"}], tmp_path, only_missing=True
    )
    assert (tmp_path / "reward.png").read_bytes() == b"keep"
    assert sorted(p.name for p in written) == sorted(set(PLOTS) - {"reward.png"})


def test_after_an_eval_the_step_lines_and_the_bar_show_its_accuracy():
    out = io.StringIO()
    p = StepProgress(3, stream=out)
    p.eval_result({"kind": "eval", "step": 0, "accuracy": float("nan")})  # no eval set: nothing to show
    p.step("step 1 line", _record(1))
    p.eval_result({"kind": "eval", "step": 1, "accuracy": 0.835})
    p.step("step 2 line", _record(2))
    assert out.getvalue() == "step 1 line\nstep 2 line | eval 0.835 @ step 1\n"
    tty = _Tty()
    bar = StepProgress(2, stream=tty)
    bar.eval_result({"kind": "eval", "step": 0, "accuracy": 0.49})
    bar.step("step 1 line", _record(1))
    bar.close()
    assert "eval 0.490" in tty.getvalue()


def test_within_a_step_the_bar_shows_the_groups_ready_of_the_target(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a terminal wide enough for every column on one line
    tty = _Tty()
    bar = StepProgress(2, stream=tty)
    ready = [3]
    bar.watch(lambda: ready[0], 8)
    bar._progress.refresh()
    ready[0] = 11  # more than a step takes (over-sampling): shown as the target
    bar.step("step 1 line", _record(1))
    bar._progress.refresh()
    bar.close()
    text = tty.getvalue()
    assert "step 1: 3/8 groups" in text and "step 2: 8/8 groups" in text


def test_log_lines_print_above_the_bar_not_glued_onto_it(capsys):
    import logging
    import sys

    handler = logging.StreamHandler(sys.stderr)  # slime train's console handler (logging.basicConfig)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        tty = _Tty()
        bar = StepProgress(2, stream=tty)
        logging.getLogger("slime.test").warning("an engine is slow")
        bar.close()
        assert handler.stream is sys.stderr  # given back when the bar stops
    finally:
        root.removeHandler(handler)
    lines = tty.getvalue().splitlines()
    assert any(line.strip() == "an engine is slow" or line.endswith("an engine is slow") for line in lines)
    assert "an engine is slow" not in capsys.readouterr().err
