"""SimEngine in-process: the cost model, resume exactness, aborts, pauses, weight updates, instant mode."""

from __future__ import annotations

import asyncio
import time

import pytest

from slime.servers.sim import SimEngine
from tests.servers.sim.helpers import fixed_config, until

PROMPT = [11, 12, 13]


async def test_one_request_of_10_tokens_at_8_ms_per_step_takes_about_80_ms():
    config = fixed_config(10, time_scale=1.0, decode_step_ms=8.0, decode_step_per_req_ms=0.0, prefill_ms_per_token=0.0)
    async with SimEngine(config) as engine:
        start = time.perf_counter()
        result = await engine.generate(PROMPT, {"max_new_tokens": 100})
        wall_s = time.perf_counter() - start
        stats = engine.stats()
    assert len(result.output_ids) == 10 and result.finish_reason.type == "stop" and result.output_ids[-1] == 2
    assert 0.075 <= wall_s < 0.2
    assert stats.num_steps == 10 and stats.busy_sim_s == pytest.approx(0.080)


async def test_running_cap_and_the_mean_running_counter_follow_a_simple_schedule():
    # 10 requests of 10 tokens, cap 3: batches of 3, 3, 3, 1 -> 40 steps of 8 ms; integral 100 x 8 ms.
    config = fixed_config(10, max_running_requests=3, decode_step_per_req_ms=0.0, prefill_ms_per_token=0.0)
    async with SimEngine(config) as engine:
        await asyncio.gather(*[engine.generate(PROMPT, {"sampling_seed": i}) for i in range(10)])
        stats = engine.stats()
    assert stats.num_steps == 40 and stats.tokens_generated == 100 and stats.requests_finished == 10
    assert stats.running_integral_s == pytest.approx(0.8)
    assert stats.mean_running_busy == pytest.approx(2.5)
    assert stats.prefill_tokens == 30


async def test_step_duration_charges_per_request_and_prefill_costs():
    config = fixed_config(2, decode_step_ms=1.0, decode_step_per_req_ms=0.5, prefill_ms_per_token=0.25)
    async with SimEngine(config) as engine:
        await asyncio.gather(engine.generate([1, 2, 3, 4], {}, "a"), engine.generate([5, 6, 7, 8], {}, "b"))
        stats = engine.stats()
    # step 0: 1 + 0.5 * 2 + 0.25 * 8 = 4 ms; step 1: 1 + 0.5 * 2 = 2 ms
    assert stats.busy_sim_s == pytest.approx(0.006) and stats.prefill_tokens == 8


async def test_aborted_then_resumed_request_ends_with_the_tokens_of_an_uninterrupted_one():
    config = fixed_config(50)
    async with SimEngine(config) as engine:
        whole = await engine.generate(PROMPT, {"max_new_tokens": 500, "sampling_seed": 3})
        task = asyncio.create_task(engine.generate(PROMPT, {"max_new_tokens": 500}, "slime-g0-s0-a0-r0-"))
        await until(lambda: engine.stats().tokens_generated >= 50 + 10)
        assert engine.abort("slime-g0-s0-a0-r0-") == 1
        part = await task
        k = len(part.output_ids)
        assert part.finish_reason.type == "abort" and 10 <= k < 50 and part.prompt_tokens == 3
        rest = await engine.generate(PROMPT + part.output_ids, {"max_new_tokens": 500 - k}, "slime-g0-s0-a1-r1-")
        fresh = await engine.generate(PROMPT, {"max_new_tokens": 500}, "slime-g0-s0-a0-r0-")
    assert rest.finish_reason.type == "stop" and rest.prompt_tokens == 3 + k
    assert part.output_ids + rest.output_ids == fresh.output_ids
    assert part.output_logprobs + rest.output_logprobs == fresh.output_logprobs
    assert len(whole.output_ids) == len(fresh.output_ids) == 50


async def test_max_new_tokens_truncates_with_finish_reason_length():
    async with SimEngine(fixed_config(50)) as engine:
        result = await engine.generate(PROMPT, {"max_new_tokens": 7, "sampling_seed": 1})
    assert len(result.output_ids) == 7 and result.finish_reason.type == "length" and result.finish_reason.length == 7


async def test_abort_by_rid_needs_an_exact_match_then_aborts_every_rid_with_that_prefix():
    async with SimEngine(fixed_config(10_000, max_running_requests=1)) as engine:
        tasks = [
            asyncio.create_task(engine.generate(PROMPT, {"max_new_tokens": 10_000}, rid)) for rid in ("job-1", "job-10")
        ]
        await until(lambda: engine.num_running == 1 and engine.num_waiting == 1)
        assert engine.abort("job-") == 0
        assert engine.abort("job-1") == 2
        running, queued = await asyncio.gather(*tasks)
    assert running.finish_reason.message == "Aborted" and running.prompt_tokens == 3
    assert queued.finish_reason.message == "Abort in waiting queue" and queued.output_ids == []
    assert queued.prompt_tokens is None and queued.cached_tokens is None


async def test_weight_update_waits_for_running_requests_without_abort_all():
    async with SimEngine(fixed_config(200, weight_sync_ms=50.0)) as engine:
        order: list[str] = []

        async def gen() -> None:
            result = await engine.generate(PROMPT, {"max_new_tokens": 500, "sampling_seed": 1})
            order.append(f"generate:{result.finish_reason.type}:{result.weight_version}")

        async def update() -> None:
            body = await engine.update_weights_from_disk("/ckpt/1", weight_version="1")
            order.append(f"update:{body['num_paused_requests']}")

        task = asyncio.create_task(gen())
        await until(lambda: engine.num_running == 1)
        await asyncio.gather(update(), task)
        assert order == ["generate:stop:default", "update:0"]
        assert engine.weight_version == "1" and engine.model_path == "/ckpt/1"


async def test_weight_update_with_abort_all_requests_aborts_first_and_holds_later_requests():
    async with SimEngine(fixed_config(200, weight_sync_ms=10_000.0)) as engine:  # 10 ms of wall time
        task = asyncio.create_task(engine.generate(PROMPT, {"max_new_tokens": 500, "sampling_seed": 1}))
        await until(lambda: engine.stats().tokens_generated >= 5)
        update = asyncio.create_task(
            engine.update_weights_from_disk("/ckpt/2", weight_version="2", abort_all_requests=True)
        )
        aborted = await task
        later = asyncio.create_task(engine.generate(PROMPT, {"max_new_tokens": 3, "sampling_seed": 2}))
        await asyncio.sleep(0)
        assert engine.num_waiting == 1 and not update.done()  # held behind the update
        await update
        result = await later
    assert aborted.finish_reason.type == "abort" and 5 <= len(aborted.output_ids) < 200
    assert set(aborted.token_weight_versions) == {"default"}
    assert result.token_weight_versions == ["2", "2", "2"]


async def test_in_place_pause_keeps_progress_and_a_weight_update_splits_the_versions():
    async with SimEngine(fixed_config(40)) as engine:
        task = asyncio.create_task(engine.generate(PROMPT, {"max_new_tokens": 500, "sampling_seed": 1}))
        await until(lambda: engine.stats().tokens_generated >= 10)
        engine.pause_generation("in_place")
        for _ in range(50):  # the step in progress ends; no further step starts
            await asyncio.sleep(0)
        before = engine.stats().tokens_generated
        for _ in range(50):
            await asyncio.sleep(0)
        assert engine.stats().tokens_generated == before and engine.num_running == 1
        body = await engine.update_weights_from_disk("/ckpt/3", weight_version="3")
        assert body["num_paused_requests"] == 1 and engine.stats().tokens_generated == before and not task.done()
        engine.continue_generation()
        result = await task
    assert len(result.output_ids) == 40 and result.finish_reason.type == "stop"
    versions = result.token_weight_versions
    assert versions == ["default"] * before + ["3"] * (40 - before)
    assert result.weight_version == "3"


async def test_retract_pause_requeues_running_requests_that_finish_after_continue():
    async with SimEngine(fixed_config(40)) as engine:
        whole = await engine.generate(PROMPT, {"max_new_tokens": 500, "sampling_seed": 1})
        task = asyncio.create_task(engine.generate_output(PROMPT, {"max_new_tokens": 500, "sampling_seed": 1}))
        await until(lambda: engine.stats().tokens_generated >= 40 + 10)
        engine.pause_generation("retract")
        assert engine.num_running == 0 and engine.num_waiting == 1
        engine.continue_generation()
        out = await task
        stats = engine.stats()
    assert out.tokens()[0] == whole.output_ids and out.num_retractions == 1
    assert stats.prefill_tokens > 3 + 3 + 10  # the retracted request's tokens were prefilled again


async def test_a_retracted_request_aborted_in_the_queue_returns_its_tokens_in_the_queued_shape():
    async with SimEngine(fixed_config(40)) as engine:
        task = asyncio.create_task(engine.generate(PROMPT, {"max_new_tokens": 500, "sampling_seed": 1}))
        await until(lambda: engine.stats().tokens_generated >= 10)
        engine.pause_generation("retract")
        engine.abort_all()
        result = await task
    assert result.finish_reason.message == "Abort in waiting queue" and result.prompt_tokens is None
    assert len(result.output_ids) >= 10 and len(result.output_logprobs) == len(result.output_ids)


async def test_pause_in_abort_mode_aborts_and_holds_new_requests_until_continue():
    async with SimEngine(fixed_config(100)) as engine:
        task = asyncio.create_task(engine.generate(PROMPT, {"sampling_seed": 1}))
        await until(lambda: engine.num_running == 1)
        engine.pause_generation("abort")
        assert (await task).finish_reason.type == "abort"
        held = asyncio.create_task(engine.generate(PROMPT, {"max_new_tokens": 2, "sampling_seed": 2}))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not held.done() and engine.num_waiting == 1 and not engine.flush_cache()
        engine.continue_generation()
        assert len((await held).output_ids) == 2 and engine.flush_cache()


async def test_instant_mode_finishes_without_steps_and_still_honours_pause():
    async with SimEngine(fixed_config(1000, instant=True, time_scale=1.0)) as engine:
        start = time.perf_counter()
        results = await asyncio.gather(
            *[engine.generate(PROMPT, {"max_new_tokens": 2000, "sampling_seed": i}) for i in range(20)]
        )
        assert time.perf_counter() - start < 0.5
        assert all(len(r.output_ids) == 1000 for r in results)
        engine.pause_generation("in_place")
        held = asyncio.create_task(engine.generate(PROMPT, {"sampling_seed": 99}))
        await asyncio.sleep(0)
        assert not held.done()
        engine.continue_generation()
        await held
        stats = engine.stats()
    assert stats.num_steps == 0 and stats.tokens_generated == 20 * 1000 + 128 and stats.requests_finished == 21


async def test_a_cancelled_caller_aborts_its_request_and_frees_the_rid():
    async with SimEngine(fixed_config(10_000)) as engine:
        task = asyncio.create_task(engine.generate(PROMPT, {"max_new_tokens": 10_000}, "r"))
        await until(lambda: engine.num_running == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.num_running == 0 and engine.stats().requests_aborted == 1
        result = await engine.generate(PROMPT, {"max_new_tokens": 1}, "r")
    assert len(result.output_ids) == 1


async def test_duplicate_rid_and_bad_inputs_raise_value_error():
    async with SimEngine(fixed_config(10_000)) as engine:
        task = asyncio.create_task(engine.generate(PROMPT, {"max_new_tokens": 10_000}, "dup"))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="Duplicate request ID"):
            await engine.generate(PROMPT, {}, "dup")
        for ids, params in (([], {}), ([-1], {}), (PROMPT, {"n": 2}), (PROMPT, {"max_new_tokens": -1})):
            with pytest.raises(ValueError):
                engine.submit(ids, params)
        engine.abort_all()
        await task
