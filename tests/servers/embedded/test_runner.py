"""slime/servers/embedded/runner.py: continuous batching is exact, and finish reasons follow 0.5.23."""

from __future__ import annotations

import dataclasses

import pytest

from slime.servers.embedded.runner import ModelRunner
from tests.servers.embedded.helpers import StepGate, make_request, max_abs_diff, reference_logprobs

PROMPTS = [[3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [20], [30, 31, 32, 33, 34], [40, 41]]
MAX_NEW = [12, 5, 16, 9, 14]  # rows finish at different steps and leave the batch


@pytest.fixture
def make_runner(loaded):
    runners = []

    def make(**kwargs) -> ModelRunner:
        runner = ModelRunner(kwargs.pop("loaded", loaded), **kwargs)
        runner.start()
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.stop()


def _run_alone(runner, **params):
    out = []
    for i, prompt in enumerate(PROMPTS):
        req = make_request(f"r{i}", prompt, max_new_tokens=MAX_NEW[i], **params)
        runner.submit([req])
        out.append(req.done.result(timeout=10))
    return out


@pytest.mark.parametrize(
    "params",
    [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_p=0.95, top_k=40)],
    ids=["greedy", "sampled", "sampled-truncated"],
)
def test_batched_decode_with_midway_joins_matches_each_alone_and_a_full_forward(make_runner, hf_model, params):
    alone = _run_alone(make_runner(), **params)
    runner = make_runner()
    gate = StepGate(lambda r: any(len(q.output_ids) >= 3 for q in r._running))
    runner.step_hook = gate
    reqs = [make_request(f"r{i}", p, max_new_tokens=MAX_NEW[i], **params) for i, p in enumerate(PROMPTS)]
    runner.submit(reqs[:2])
    assert gate.reached.wait(10)
    runner.submit(reqs[2:])  # joins after decode step 3 of the first two
    gate.release()
    for req, ref in zip(reqs, alone):
        req.done.result(timeout=10)
        assert req.output_ids == ref.output_ids
        assert len(req.output_ids) == MAX_NEW[reqs.index(req)]
        assert max_abs_diff(req.output_logprobs, ref.output_logprobs) <= 1e-5
        full = reference_logprobs(hf_model, req.prompt_ids, req.output_ids, params["temperature"])
        assert max_abs_diff(req.output_logprobs, full) <= 1e-5


def test_running_requests_are_capped_and_the_rest_wait(make_runner):
    runner = make_runner(max_running_requests=2)
    sizes = []
    runner.step_hook = lambda r: sizes.append(len(r._running))
    reqs = [make_request(f"c{i}", [5 + i, 6], max_new_tokens=6, temperature=0.0) for i in range(5)]
    runner.submit(reqs)
    assert all(len(r.done.result(timeout=10).output_ids) == 6 for r in reqs)
    assert max(sizes) == 2


def test_retract_pause_recomputes_kv_and_continues_token_exactly(make_runner):
    params = dict(temperature=0.9, max_new_tokens=10)
    baseline = make_runner()
    ref = make_request("x", [9, 8, 7], **params)
    baseline.submit([ref])
    ref.done.result(timeout=10)

    runner = make_runner()
    gate = runner.step_hook = StepGate(lambda r: len(r._running[0].output_ids) >= 4)
    req = make_request("x", [9, 8, 7], **params)
    runner.submit([req])
    assert gate.reached.wait(10)
    runner.pause("retract").result(timeout=10)  # lands after decode step 3 (4 tokens)
    assert req.queued and req.num_retractions == 1 and not req.done.done()
    runner.resume().result(timeout=10)
    req.done.result(timeout=10)
    assert req.output_ids == ref.output_ids and req.finish_reason == {"type": "length", "length": 10}
    assert max_abs_diff(req.output_logprobs, ref.output_logprobs) <= 1e-5


def test_stop_token_ends_the_request_and_is_kept_in_the_output(make_runner):
    runner = make_runner()
    [free] = _run_alone_one(runner, max_new_tokens=8)
    stop_at = next(i for i, t in enumerate(free.output_ids) if t not in free.output_ids[:i] and i >= 2)
    tok = free.output_ids[stop_at]
    [req] = _run_alone_one(runner, max_new_tokens=8, stop_token_ids=frozenset({tok}), ignore_eos=False)
    assert req.output_ids == free.output_ids[: stop_at + 1]
    assert req.finish_reason == {"type": "stop", "matched": tok}
    [ignored] = _run_alone_one(runner, max_new_tokens=8, stop_token_ids=frozenset({tok}), ignore_eos=True)
    assert ignored.output_ids == free.output_ids and ignored.finish_reason == {"type": "length", "length": 8}


def test_eos_sampled_exactly_at_max_new_tokens_is_stop_not_length(make_runner, loaded):
    [free] = _run_alone_one(make_runner(), max_new_tokens=4)
    eos = free.output_ids[3]
    assert eos not in free.output_ids[:3]  # true for the seed-0 tiny model
    runner = make_runner(loaded=dataclasses.replace(loaded, eos_token_ids=frozenset({eos})))
    [req] = _run_alone_one(runner, max_new_tokens=4, ignore_eos=False)
    assert req.output_ids == free.output_ids[:4]
    assert req.finish_reason == {"type": "stop", "matched": eos}


def test_max_new_tokens_zero_finishes_with_no_output(make_runner):
    [req] = _run_alone_one(make_runner(), max_new_tokens=0)
    assert req.output_ids == [] and req.finish_reason == {"type": "length", "length": 0}


def _run_alone_one(runner, **params):
    req = make_request("one", [11, 12, 13], **{"temperature": 0.0, **params})
    runner.submit([req])
    return [req.done.result(timeout=10)]


def test_weight_update_waits_for_earlier_requests_and_holds_later_ones(make_runner):
    runner = make_runner()
    gate = runner.step_hook = StepGate(lambda r: any(len(q.output_ids) >= 3 for q in r._running))
    early = make_request("early", [5, 6], max_new_tokens=8, temperature=0.0)
    runner.submit([early])
    assert gate.reached.wait(10)
    update = runner.update_weights(None, weight_version="v2")  # a version-only update takes the same barrier
    late = make_request("late", [5, 6], max_new_tokens=8, temperature=0.0)
    runner.submit([late])
    assert update.result(timeout=10) == 0
    assert early.done.result(timeout=10).output_versions == ["default"] * 8
    assert late.done.result(timeout=10).output_versions == ["v2"] * 8
