"""Control endpoints of the embedded engine: abort, pause / continue, weight reload, flush, versions."""

from __future__ import annotations

import asyncio

import pytest
import torch

from slime.servers.embedded import EngineServer
from tests.servers.embedded.helpers import StepGate, max_abs_diff, reference_logprobs

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
QUEUED_META = {
    "id",
    "finish_reason",
    "weight_version",
    "weight_versions",
    "e2e_latency",
    "completion_tokens",
    "input_token_logprobs",
    "output_token_logprobs",
    "output_token_logprobs_length",
}


async def _post(session, engine, path, body):
    async with session.post(f"{engine.url}{path}", json=body) as resp:
        return resp.status, (await resp.json() if resp.content_type == "application/json" else await resp.text())


def _generate(session, engine, rid, **body):
    body = {"input_ids": [3, 1, 4, 1, 5], "rid": rid, "return_logprob": True, "sampling_params": GREEDY, **body}
    return asyncio.create_task(_post(session, engine, "/generate", body))


async def _until_inflight(engine, *rids):
    while not all(rid in engine.inflight for rid in rids):
        await asyncio.sleep(0.001)


def _gate(engine, rid, num_tokens=3):
    """Hold the runner once request ``rid`` has ``num_tokens`` outputs, until a control op arrives."""
    gate = StepGate(lambda r: any(q.rid == rid and len(q.output_ids) >= num_tokens for q in r._running))
    engine.runner.step_hook = gate
    return gate


async def test_abort_mid_generation_returns_partial_tokens_and_their_logprobs(engine, session, hf_model):
    gate = _gate(engine, "a1")
    task = _generate(session, engine, "a1", sampling_params={**GREEDY, "max_new_tokens": 50, "temperature": 0.9})
    assert await asyncio.to_thread(gate.reached.wait, 10)
    status, body = await _post(session, engine, "/abort_request", {"rid": "a1"})
    assert (status, body) == (200, "")
    status, out = await task
    meta = out["meta_info"]
    assert status == 200 and meta["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert len(out["output_ids"]) == meta["completion_tokens"] == meta["output_token_logprobs_length"] == 3
    assert meta["prompt_tokens"] == 5 and meta["weight_versions"] == [{"version": "default", "start": 0, "end": 3}]
    full = reference_logprobs(hf_model, [3, 1, 4, 1, 5], out["output_ids"], 0.9)
    assert max_abs_diff([e[0] for e in meta["output_token_logprobs"]], full) <= 1e-5


async def test_abort_of_a_queued_request_uses_the_waiting_queue_shape(engine, session):
    assert (await _post(session, engine, "/pause_generation", {"mode": "in_place"}))[0] == 200
    task = _generate(session, engine, "q1")
    await _until_inflight(engine, "q1")
    await _post(session, engine, "/abort_request", {"rid": "q1"})
    status, out = await task
    assert status == 200 and out["output_ids"] == [] and set(out["meta_info"]) == QUEUED_META
    assert out["meta_info"]["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert out["meta_info"]["weight_versions"] == [{"version": "default", "start": 0, "end": 0}]


async def test_abort_matches_an_inflight_rid_exactly_then_aborts_by_prefix(engine, session):
    await _post(session, engine, "/pause_generation", {"mode": "in_place"})
    tasks = [_generate(session, engine, rid) for rid in ("job-1", "job-10", "job-2")]
    await _until_inflight(engine, "job-1", "job-10", "job-2")
    await _post(session, engine, "/abort_request", {"rid": "job-"})  # not an in-flight rid: no-op
    await _post(session, engine, "/abort_request", {"rid": "job-1"})  # aborts job-1 and job-10
    await asyncio.wait(tasks[:2], timeout=10)
    assert all(t.done() for t in tasks[:2]) and not tasks[2].done()
    await _post(session, engine, "/continue_generation", {})
    assert (await tasks[2])[1]["meta_info"]["finish_reason"]["type"] == "length"


async def test_abort_all_aborts_running_and_queued_requests_with_their_two_shapes(tiny_model_path, session):
    async with EngineServer(tiny_model_path, port=0, max_running_requests=1) as engine:
        gate = _gate(engine, "run")
        running = _generate(session, engine, "run", sampling_params={**GREEDY, "max_new_tokens": 50})
        assert await asyncio.to_thread(gate.reached.wait, 10)
        queued = _generate(session, engine, "wait")
        await _until_inflight(engine, "wait")
        await _post(session, engine, "/abort_request", {"abort_all": True})
        (_, run_out), (_, wait_out) = await running, await queued
    assert run_out["meta_info"]["finish_reason"]["message"] == "Aborted" and len(run_out["output_ids"]) == 3
    assert wait_out["meta_info"]["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}


async def test_pause_holds_new_requests_until_continue(engine, session):
    reference = (
        await _post(session, engine, "/generate", {"input_ids": [7, 7], "rid": "ref", "sampling_params": GREEDY})
    )[1]
    assert await _post(session, engine, "/pause_generation", {"mode": "abort"}) == (
        200,
        {"message": "Generation paused successfully.", "status": "ok"},
    )
    task = _generate(session, engine, "held", input_ids=[7, 7])
    await _until_inflight(engine, "held")
    await asyncio.sleep(0.05)  # give a wrong implementation the chance to run it
    assert not task.done() and engine.runner.num_waiting == 1
    async with session.get(f"{engine.url}/ready") as resp:
        assert resp.status == 503
    async with session.post(f"{engine.url}/flush_cache") as resp:
        assert resp.status == 400 and await resp.text() == "Flush cache failed."
    assert await _post(session, engine, "/continue_generation", {}) == (
        200,
        {"message": "Generation continued successfully.", "status": "ok"},
    )
    status, out = await task
    assert status == 200 and out["output_ids"] == reference["output_ids"]
    async with session.post(f"{engine.url}/flush_cache") as resp:
        assert resp.status == 200 and (await resp.text()).startswith("Cache flushed.")


async def test_weight_reload_changes_greedy_outputs_and_the_weight_version(engine, session, tiny_model_v2_path):
    from transformers import AutoModelForCausalLM

    body = {"input_ids": [3, 1, 4, 1, 5], "return_logprob": True, "sampling_params": GREEDY}
    before = (await _post(session, engine, "/generate", body))[1]
    status, out = await _post(
        session, engine, "/update_weights_from_disk", {"model_path": str(tiny_model_v2_path), "weight_version": "v2"}
    )
    assert (status, out) == (
        200,
        {
            "success": True,
            "num_paused_requests": 0,
            "message": "Succeeded to update model weights. Weight version updated to v2.",
        },
    )
    after = (await _post(session, engine, "/generate", body))[1]
    assert after["output_ids"] != before["output_ids"] and after["meta_info"]["weight_version"] == "v2"
    v2 = AutoModelForCausalLM.from_pretrained(tiny_model_v2_path, dtype=torch.float32).eval()
    full = reference_logprobs(v2, body["input_ids"], after["output_ids"], 0.0)
    assert max_abs_diff([e[0] for e in after["meta_info"]["output_token_logprobs"]], full) <= 1e-5
    async with session.get(f"{engine.url}/model_info") as resp:
        info = await resp.json()
    assert info["model_path"] == str(tiny_model_v2_path) and info["weight_version"] == "v2"


async def test_weight_reload_from_a_bad_path_fails_and_keeps_the_served_weights(engine, session, tmp_path):
    status, out = await _post(
        session, engine, "/update_weights_from_disk", {"model_path": str(tmp_path / "missing"), "weight_version": "x"}
    )
    assert status == 400 and out["success"] is False and "missing" in out["message"] and out["num_paused_requests"] == 0
    async with session.get(f"{engine.url}/model_info") as resp:
        assert (await resp.json())["weight_version"] == "default"


@pytest.mark.parametrize("abort_all", [False, True])
async def test_weight_update_waits_for_inflight_requests_unless_told_to_abort(
    engine, session, tiny_model_v2_path, abort_all
):
    gate = _gate(engine, "w1")
    task = _generate(session, engine, "w1")
    assert await asyncio.to_thread(gate.reached.wait, 10)
    status, out = await _post(
        session,
        engine,
        "/update_weights_from_disk",
        {"model_path": str(tiny_model_v2_path), "weight_version": "v2", "abort_all_requests": abort_all},
    )
    assert status == 200 and out["success"]
    meta = (await task)[1]["meta_info"]
    assert meta["finish_reason"]["type"] == ("abort" if abort_all else "length")
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 3 if abort_all else 8}]


async def _update_with_a_request_paused_in_place(engine, session, model_path, **body):
    """A request paused in place mid-generation, then /update_weights_from_disk to version v2."""
    gate = _gate(engine, "s1")
    task = _generate(session, engine, "s1")
    assert await asyncio.to_thread(gate.reached.wait, 10)
    await _post(session, engine, "/pause_generation", {"mode": "in_place"})
    status, out = await _post(
        session, engine, "/update_weights_from_disk", {"model_path": str(model_path), "weight_version": "v2", **body}
    )
    return task, status, out


async def test_in_place_pause_then_update_resumes_on_new_weights_with_version_spans(
    engine, session, tiny_model_v2_path
):
    task, status, out = await _update_with_a_request_paused_in_place(
        engine, session, tiny_model_v2_path, flush_cache=False
    )
    assert status == 200 and out["num_paused_requests"] == 1 and not task.done()
    await _post(session, engine, "/continue_generation", {})
    meta = (await task)[1]["meta_info"]
    assert meta["weight_versions"] == [
        {"version": "default", "start": 0, "end": 3},
        {"version": "v2", "start": 3, "end": 8},
    ]
    assert meta["weight_version"] == "v2"


async def test_in_place_pause_then_update_with_flush_cache_kills_the_engine_like_sglang_0_5_17(
    engine, session, tiny_model_v2_path
):
    task, status, out = await _update_with_a_request_paused_in_place(
        engine, session, tiny_model_v2_path
    )  # flush_cache defaults to true
    assert status == 500 and "Cache flush failed after updating weights" in out["message"]
    async with session.get(f"{engine.url}/health_generate") as resp:
        assert resp.status == 503  # dead, as the real server is
    task.cancel()


async def test_update_weight_version_sets_the_version_reported_everywhere(engine, session):
    status, out = await _post(session, engine, "/update_weight_version", {"new_version": "step-7"})
    assert (status, out) == (
        200,
        {"success": True, "message": "Weight version updated to step-7", "new_version": "step-7"},
    )
    gen = (await _post(session, engine, "/generate", {"input_ids": [2], "sampling_params": {"max_new_tokens": 1}}))[1]
    assert gen["meta_info"]["weight_version"] == "step-7"
    async with session.get(f"{engine.url}/model_info") as resp:
        assert (await resp.json())["weight_version"] == "step-7"


async def test_health_answers_503_while_not_ready_or_paused(engine, session):
    engine.ready = False  # as during start-up
    for path in ("/health", "/health_generate", "/ready"):
        async with session.get(f"{engine.url}{path}") as resp:
            assert resp.status == 503, path
    engine.ready = True
    await _post(session, engine, "/pause_generation", {"mode": "in_place"})
    async with session.get(f"{engine.url}/health_generate") as resp:
        assert resp.status == 503
    async with session.get(f"{engine.url}/health") as resp:
        assert resp.status == 200


async def test_close_aborts_inflight_requests_and_is_idempotent(tiny_model_path, session):
    engine = await EngineServer(tiny_model_path, port=0).start()
    await _post(session, engine, "/pause_generation", {"mode": "in_place"})
    task = _generate(session, engine, "c1")
    await _until_inflight(engine, "c1")
    await engine.close()
    await engine.close()
    status, out = await task
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"
