"""Every JSON file a run writes is valid (RFC 8259) JSON: NaN and infinities become null."""

from __future__ import annotations

import json
import math

import pytest

from slime.loop.outputs import MetricsWriter, write_json_atomic


def _strict_load(text: str):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


RECORD = {
    "kind": "eval",
    "step": 0,
    "accuracy": math.nan,
    "nested": {"a": [1.0, math.inf, -math.inf]},
    "t": (0.5, math.nan),
}
WANT = {"kind": "eval", "step": 0, "accuracy": None, "nested": {"a": [1.0, None, None]}, "t": [0.5, None]}


def test_summary_json_writes_null_for_nan_and_infinity(tmp_path):
    write_json_atomic(tmp_path / "summary.json", RECORD)
    assert _strict_load((tmp_path / "summary.json").read_text()) == WANT


def test_metrics_jsonl_writes_null_and_keeps_in_memory_what_the_file_holds(tmp_path):
    writer = MetricsWriter(tmp_path)
    writer.write(dict(RECORD))
    writer.write({"kind": "step", "lag_histogram": {0: 3, 2: 1}, "reward_mean": 0.5})
    writer.close()
    lines = [_strict_load(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0] == WANT and lines[1]["lag_histogram"] == {"0": 3, "2": 1}
    assert writer.records == lines  # a fresh run's records are what a resumed run reads back


def test_slime_report_json_is_strict(tmp_path, capsys):
    from slime.obs.report import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "step": 0, "accuracy": None}) + "\n")
    assert main([str(run), "--json", "--no-plots"]) == 0
    out = _strict_load(capsys.readouterr().out)
    assert out["eval_accuracy_before"] is None


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_number_never_reaches_a_file_as_a_bare_token(tmp_path, value):
    write_json_atomic(tmp_path / "x.json", {"v": value})
    assert "NaN" not in (tmp_path / "x.json").read_text() and "Infinity" not in (tmp_path / "x.json").read_text()
