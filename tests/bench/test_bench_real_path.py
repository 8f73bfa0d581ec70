"""The real-engine path of ``slime bench rollout`` on the CPU: per-request length enforcement, the
client-side occupancy, the decode-cost fit and the calibrated simulator (issue 13, item 7).

The "real" engine here is a simulated one served over HTTP at time scale 1 whose trajectories are
all ``max_len`` long: like SGLang with ``ignore_eos``, it stops only where ``max_new_tokens`` says.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from slime.bench.calibrate import fit_decode_cost, probe_decode_cost
from slime.bench.engine_proc import sim_engine_process
from slime.bench.lengths import DrawnLengths
from slime.bench.occupancy import OccupancyMeter
from slime.bench.overhead import SimEnginePool
from slime.bench.rollout import main
from slime.bench.workload import Workload
from slime.engines.protocol import FinishReason, GenerateResult
from slime.rollout.generate import request_id
from slime.servers.sim import SimConfig, SimEngine
from slime.types import Sample, Status

WL = Workload(median=40, p99=160, max_len=320, seed=7)


def _samples(wl: Workload, num_groups: int, n: int) -> list[Sample]:
    rows, ids = wl.prompts()
    return [
        Sample(prompt_ids=list(ids[rows[g].prompt]), group_id=g, index=i) for g in range(num_groups) for i in range(n)
    ]


def test_the_draw_is_the_sim_engines_own_length():
    """A sim engine with the workload's length distribution stops each sample exactly at the draw."""
    lengths = DrawnLengths(median=WL.median, p99=WL.p99, max_len=WL.max_len, seed=WL.seed)
    samples = _samples(WL, 8, 8)

    async def engine_lengths() -> list[int]:
        cfg = SimConfig(
            instant=True,
            response_len_median=WL.median,
            response_len_p99=WL.p99,
            max_response_len=WL.max_len,
            seed=WL.seed,
        )
        async with SimEngine(cfg) as eng:
            return [
                len((await eng.generate(s.prompt_ids, {"max_new_tokens": WL.max_len}, request_id(s))).output_ids)
                for s in samples
            ]

    drawn = [lengths.total(s) for s in samples]
    assert drawn == asyncio.run(engine_lengths())
    assert len(set(drawn)) > 20 and max(drawn) > 3 * WL.median  # a long tail, not a constant


class _IgnoreEosPool:
    """An engine that generates exactly ``max_new_tokens`` when ``ignore_eos``, cut short by an abort
    after ``abort_after`` tokens (once)."""

    kv_cache_version = None

    def __init__(self, abort_after: int):
        self.abort_after, self.calls = abort_after, []

    async def generate(
        self, input_ids, sampling_params, *, rid=None, sticky_key=None, return_logprob=True
    ) -> GenerateResult:
        self.calls.append((list(input_ids), dict(sampling_params)))
        assert sampling_params["ignore_eos"] is True
        n, reason = (
            sampling_params["max_new_tokens"],
            FinishReason(type="length", length=sampling_params["max_new_tokens"]),
        )
        if self.abort_after is not None and self.abort_after < n:
            n, reason, self.abort_after = self.abort_after, FinishReason(type="abort", message="Aborted"), None
        return GenerateResult(
            output_ids=[5] * n,
            output_logprobs=[-1.0] * n,
            finish_reason=reason,
            weight_version="0",
            completion_tokens=n,
            rid=rid or "",
        )


def test_generate_asks_for_the_rest_of_the_draw_and_a_resume_ends_exactly_on_it():
    lengths = DrawnLengths(median=WL.median, p99=WL.p99, max_len=WL.max_len, seed=WL.seed)
    sample = next(s for s in _samples(WL, 4, 8) if lengths.total(s) > 10)
    total, pool = lengths.total(sample), _IgnoreEosPool(abort_after=7)
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}

    async def run() -> None:
        await lengths.generate(sample, params, pool=pool, max_response_len=WL.max_len, engine_version=0)
        assert sample.status is Status.PARTIAL and len(sample.response_ids) == 7
        await lengths.generate(sample, params, pool=pool, max_response_len=WL.max_len, engine_version=0)

    asyncio.run(run())
    (ids1, p1), (ids2, p2) = pool.calls
    assert p1["max_new_tokens"] == total and p2["max_new_tokens"] == total - 7  # the resume asks for the rest only
    assert ids2 == ids1 + [5] * 7 and p1["ignore_eos"] and p2["ignore_eos"]
    assert len(sample.response_ids) == total and sample.status is Status.TRUNCATED
    assert lengths.mismatches([type("G", (), {"samples": [sample]})()]) == 0
    sample.response_ids.append(5)
    assert lengths.mismatches([type("G", (), {"samples": [sample]})()]) == 1


def test_occupancy_meter_caps_in_flight_and_counts_a_pause_as_idle():
    now = [0.0]
    meter = OccupancyMeter(4, clock=lambda: now[0])
    meter.add(2)
    now[0] = 1.0
    meter.add(4)  # 6 in flight, 4 count
    now[0] = 2.0
    assert meter.occupancy() == pytest.approx((2 * 1 + 4 * 1) / (4 * 2))
    meter.set_paused(True)  # paused in place for 2 s: requests stay, nothing decodes
    now[0] = 4.0
    meter.set_paused(False)
    meter.add(-6)
    now[0] = 5.0
    assert meter.occupancy() == pytest.approx(6 / (4 * 5))
    assert meter.busy_fraction() == pytest.approx(2 / 5)
    meter.reset()
    meter.add(4)
    now[0] = 6.0
    assert meter.occupancy() == 1.0
    with pytest.raises(ValueError):
        OccupancyMeter(0)


def test_fit_recovers_a_line_and_needs_two_batch_sizes():
    cost = fit_decode_cost(
        [(1, 1.95 + 0.0096), (64, 1.95 + 0.0096 * 64), (256, 1.95 + 0.0096 * 256)], prefill_ms_per_token=0.004
    )
    assert cost.decode_step_ms == pytest.approx(1.95) and cost.decode_step_per_req_ms == pytest.approx(0.0096)
    assert cost.r2 == pytest.approx(1.0) and cost.prefill_ms_per_token == 0.004
    noisy = fit_decode_cost([(1, 1.98), (64, 2.57), (256, 4.44)])  # the H200 numbers of issue 13
    assert noisy.decode_step_ms == pytest.approx(1.95, abs=0.1) and noisy.decode_step_per_req_ms == pytest.approx(
        0.0096, rel=0.05
    )
    with pytest.raises(ValueError):
        fit_decode_cost([(8, 2.0), (8, 2.1)])


def test_probe_recovers_the_decode_cost_of_an_engine_and_refuses_one_that_stops_early():
    async def run(cfg: SimConfig, **kw):
        async with SimEngine(cfg) as eng:
            return await probe_decode_cost(SimEnginePool(eng), log=lambda _: None, **kw)

    cfg = SimConfig(
        decode_step_ms=4.0,
        decode_step_per_req_ms=0.25,
        prefill_ms_per_token=0.01,
        time_scale=1.0,
        response_len_median=64,
        response_len_p99=64,
        max_response_len=64,
        max_running_requests=32,
    )
    cost = asyncio.run(
        run(cfg, batch_sizes=(1, 8, 32), prompt_len=16, short=4, long=24, prefill_len=400, prefill_batch=4)
    )
    assert cost.decode_step_ms == pytest.approx(4.0, rel=0.25) and cost.decode_step_per_req_ms == pytest.approx(
        0.25, rel=0.25
    )
    assert cost.prefill_ms_per_token == pytest.approx(0.01, rel=0.5)
    early = SimConfig(decode_step_ms=1.0, response_len_median=10, response_len_p99=10, max_response_len=10)
    with pytest.raises(RuntimeError, match="ignore_eos"):
        asyncio.run(run(early, batch_sizes=(1, 2), prompt_len=8, short=4, long=24, prefill_batch=0))


REAL = [
    "--max-running-requests",
    "16",
    "--decode-step-ms",
    "4",
    "--decode-step-per-req-ms",
    "0.4",
    "--prefill-ms-per-token",
    "0.002",
    "--weight-sync-ms",
    "50",
    "--time-scale",
    "1",
    "--response-len-median",
    "320",
    "--response-len-p99",
    "320",
    "--max-response-len",
    "320",
    "--seed",
    "0",
    "--weight-version",
    "default",
]
BENCH = [
    "--steps",
    "2",
    "--median",
    "40",
    "--p99",
    "160",
    "--max-len",
    "320",
    "--seed",
    "7",
    "--train-s",
    "0.3",
    "--rollout-batch-size",
    "4",
    "--n-samples-per-prompt",
    "4",
    "--max-running-requests",
    "16",
    "--april-over-sampling",
    "8",
    "--async-capacity",
    "6",
    "--overhead-samples",
    "0",
    "--http-requests",
    "0",
    "--time-scale",
    "4",
    "--calibrate-sim",
    "--probe-batch-sizes",
    "1,4,16",
    "--probe-prompt-len",
    "16",
    "--probe-tokens",
    "4,36",
]


def test_bench_against_an_engine_by_url_calibrates_the_sim_and_enforces_every_length(tmp_path):
    out = tmp_path / "bench.json"

    async def serve_and_run() -> int:
        async with sim_engine_process(REAL) as proc:
            return await asyncio.to_thread(
                main,
                [
                    *BENCH,
                    "--engine-urls",
                    proc.url,
                    "--weights-path",
                    str(tmp_path),
                    "--json",
                    str(out),
                    "--png",
                    str(tmp_path / "b.png"),
                ],
            )

    assert asyncio.run(serve_and_run()) == 0
    res = json.loads(out.read_text())
    cal = res["calibration"]
    # a per-request cost large enough (6.4 ms at 16 running) to stand out of the jitter of a shared 2-core machine
    assert cal["decode_step_ms"] == pytest.approx(4.0, rel=0.35) and cal["decode_step_per_req_ms"] == pytest.approx(
        0.4, rel=0.4
    )
    assert res["workload"]["time_scale"] == 1.0 and res["sim_workload"]["time_scale"] == 4.0
    lengths = DrawnLengths(median=40, p99=160, max_len=320, seed=7)
    drawn_first_batches = sum(
        lengths.total(s) for s in _samples(Workload(median=40, p99=160, max_len=320, seed=7), 2 * 4, 4)
    )
    for runs in (res["modes"], res["sim_modes"]):
        assert runs["sync"]["delivered_tokens"] == drawn_first_batches  # sync takes groups 0..7 in order
        for mode, m in runs.items():
            assert m["length_mismatch_samples"] == 0, mode
            assert 0.0 < m["engine_occupancy"] <= 1.0
    assert res["modes"]["april"]["resumed_samples"] > 0  # partials resumed to exactly their draw
    for mode, m in res["modes"].items():  # the client-side measure agrees with the engine's own
        # the client never sees fewer requests in flight than the engine runs
        assert m["engine_occupancy"] >= m["slot_utilization"] - 0.1, mode
        if mode != "april":
            assert m["engine_occupancy"] == pytest.approx(m["slot_utilization"], abs=0.1), mode
    # APRIL's 136 requests (78 aborted, 56 resumed) each add a round trip the engine does not count; on CI's loaded
    # 2-core machine (stop 37) a 0.7 s stall of the engine process during step 1 left the client 0.27 above it
    april = res["modes"]["april"]
    assert april["engine_occupancy"] <= april["slot_utilization"] + 0.35
    # the sim calibrated to a sim is close to it: a calibration bug (a unit off by 1000, the time scale applied
    # twice: 4x) is far outside 60 %; a loaded 2-core machine's jitter reached 45 % (the accuracy is the benchmark's)
    for mode, row in res["sim_vs_real"].items():
        assert abs(row["rel_error"]) < 0.6, (mode, row)
    assert all(t["met"] is not False for name, t in res["targets"].items() if "length_mismatch" in name)


def test_docstring_example_of_the_standard_draw():
    wl = Workload()
    lengths = DrawnLengths(median=wl.median, p99=wl.p99, max_len=wl.max_len, seed=wl.seed)
    assert lengths.total(_samples(wl, 1, 8)[3]) == 1323


@pytest.mark.parametrize(
    "argv",
    [
        ["--calibrate-sim"],  # nothing real to calibrate against
        ["--engine-urls", "127.0.0.1:1"],  # a real engine needs a checkpoint to load
        ["--engine-urls", "127.0.0.1:1", "--weights-path", "w", "--calibrate-sim", "--probe-tokens", "16"],
        ["--engine-urls", "127.0.0.1:1", "--weights-path", "w", "--calibrate-sim", "--probe-batch-sizes", "8"],
        ["--engine-urls", "127.0.0.1:1", "--weights-path", "w", "--calibrate-sim", "--probe-batch-sizes", "1,512"],
        ["--median", "50", "--p99", "10"],
    ],
)
def test_bench_rejects_inconsistent_real_engine_flags(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
