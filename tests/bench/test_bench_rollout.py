"""``slime bench rollout``, tiny: 2 steps per mode, short responses, time scale 50 (a few seconds)."""

from __future__ import annotations

import json

import pytest

from slime.bench.rollout import main

TINY = [
    "--steps",
    "2",
    "--time-scale",
    "50",
    "--train-s",
    "3",
    "--median",
    "40",
    "--p99",
    "160",
    "--max-len",
    "320",
    "--overhead-samples",
    "2000",
    "--http-requests",
    "200",
    "--http-concurrency",
    "16",
]
MODE_KEYS = (
    "delivered_tokens_per_s",
    "samples_per_s",
    "slot_utilization",
    "step_time_p50_s",
    "step_time_p99_s",
    "wasted_tokens",
    "client_cpu_ms_per_request",
)


def test_bench_rollout_writes_every_mode_with_sane_numbers(tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    assert main([*TINY, "--json", str(out), "--png", str(png)]) == 0
    results = json.loads(out.read_text())
    for key in ("modes", "scheduler_completions_per_s", "http_requests_per_s", "bare_aiohttp_requests_per_s"):
        assert key in results
    assert list(results["modes"]) == ["sync", "april", "async"]
    assert results["scheduler_completions_per_s"] > 0 and results["http_requests_per_s"] > 0
    assert results["bare_aiohttp_requests_per_s"] > 0
    for mode, m in results["modes"].items():
        for key in MODE_KEYS:
            assert isinstance(m[key], (int, float)), f"{mode}.{key} = {m[key]!r}"
        assert m["delivered_tokens_per_s"] > 0 and m["samples_per_s"] > 0
        assert 0.0 < m["slot_utilization"] <= 1.0
        assert 0.0 < m["step_time_p50_s"] <= m["step_time_p99_s"]
        assert m["wasted_tokens"] >= 0 and m["client_cpu_ms_per_request"] > 0
        assert m["delivered_samples"] == 2 * 32 * 8
        # every generated token is trained, masked, or still waiting in the buffer
        assert (
            m["generated_tokens"]
            == m["trained_tokens"] + m["leftover_partial_tokens"] + m["leftover_ready_tokens"] + m["wasted_tokens"]
        )
        assert sum(m["lag_histogram"].values()) == m["delivered_tokens"]
    sync = results["modes"]["sync"]
    assert sync["requests_issued"] == 2 * 32 * 8 and sync["aborted_samples"] == 0 and sync["wasted_tokens"] == 0
    assert sync["off_policy_token_fraction"] == 0.0 and sync["speedup_vs_sync"] == 1.0
    assert png.stat().st_size > 1000
    # a short run is off the standard workload: its speedup targets are not applicable, never MISSED (issue 31)
    speedup = results["targets"]["april.speedup_vs_sync"]
    assert speedup["met"] is None and speedup["not_applicable"].startswith("off the standard workload: --steps 2")
    assert results["targets"]["sync.client_cpu_ms_per_request"]["met"] is not None  # holds for any workload


def test_off_the_standard_workload_the_table_says_not_applicable_instead_of_missed():
    from slime.bench.rollout_table import check_targets, format_table, off_standard
    from slime.bench.workload import Workload

    results = {"modes": {"april": {"speedup_vs_sync": 1.2, "lag_histogram": {0: 1}}}}
    assert off_standard(Workload()) is None and off_standard(Workload(seed=7)) is None
    assert off_standard(Workload(steps=2, time_scale=9.0), real_engine=True) == "--steps 2 (standard 10)"
    results["targets"] = check_targets(results, off_workload=off_standard(Workload(steps=2)))
    table = format_table(results)
    assert "target april.speedup_vs_sync >= 1.8: measured 1.2 -> n/a (off the standard workload: --steps 2" in table
    assert "MISSED" not in table
    results["targets"] = check_targets(results)  # the standard workload: the target holds
    assert "target april.speedup_vs_sync >= 1.8: measured 1.2 -> MISSED" in format_table(results)


def test_bench_rollout_rejects_an_unknown_mode():
    with pytest.raises(SystemExit) as exc:
        main(["--modes", "sync,turbo"])
    assert exc.value.code == 2
