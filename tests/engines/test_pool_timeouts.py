"""A /generate past ``request_timeout_s``: the pool aborts it by rid (tokens kept, the sample resumes)
or, on an engine that answers nothing, it is a failed attempt (``--max-retries``) and a failure on the
engine's breaker; ``give_up_inflight`` ends the calls of hung engines as aborts and takes them out."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from slime.config import RolloutConfig
from slime.engines.pool import HttpEnginePool
from slime.errors import EngineUnavailable
from slime.rollout.generate import generate
from slime.types import Sample, Status
from tests.engines.test_client import generate_body

TIMEOUTS = RolloutConfig(request_timeout_s=0.2, control_timeout_s=0.3, max_retries=0, retry_backoff_s=0.01)


def _aborted_body(rid: str, ids: tuple[int, ...]) -> dict:
    body = generate_body(rid, ids)
    body["meta_info"]["finish_reason"] = {"type": "abort", "message": "Aborted"}
    return body


def _honours_abort(engine, tokens_so_far=(7, 8, 9)):
    """/generate runs until /abort_request names its rid, then answers with its tokens so far."""
    aborted: dict[str, asyncio.Event] = {}

    async def gen(request: web.Request) -> web.Response:
        rid = (await request.json())["rid"]
        await aborted.setdefault(rid, asyncio.Event()).wait()
        return web.json_response(_aborted_body(rid, tokens_so_far))

    async def abort(request: web.Request) -> web.Response:
        aborted.setdefault((await request.json())["rid"], asyncio.Event()).set()
        return web.Response(status=200)

    engine.routes["/generate"], engine.routes["/abort_request"] = gen, abort


def _hung(engine):
    """Answers neither /generate nor /abort_request (a wedged GPU)."""
    forever = asyncio.Event()

    async def stall(request: web.Request) -> web.Response:
        await forever.wait()
        return web.Response(status=200)

    engine.routes["/generate"] = engine.routes["/abort_request"] = stall


async def test_a_request_past_its_timeout_is_aborted_by_rid_and_keeps_its_tokens(start_engines) -> None:
    (engine,) = await start_engines()
    _honours_abort(engine)
    async with HttpEnginePool([engine.url], config=TIMEOUTS) as pool:
        result = await pool.generate([1, 2], {}, rid="slime-g0-s0-a0-r0-")
        assert result.aborted and result.output_ids == [7, 8, 9]
        assert [c[2] for c in engine.calls if c[1] == "/abort_request"] == [
            {"rid": "slime-g0-s0-a0-r0-", "abort_all": False}
        ]
        assert pool.engine_states()[0]["consecutive_failures"] == 0, "the engine answered: not a failure"


async def test_the_sample_of_a_timed_out_request_stays_resumable(start_engines) -> None:
    (engine,) = await start_engines()
    _honours_abort(engine)
    async with HttpEnginePool([engine.url], config=TIMEOUTS) as pool:
        sample = await generate(Sample(prompt_ids=[1, 2]), {}, pool=pool, max_response_len=16, engine_version=0)
        assert sample.status is Status.PARTIAL and sample.response_ids == [7, 8, 9]
        engine.on("/generate", body=generate_body("r", (4, 2)))
        sample = await generate(sample, {}, pool=pool, max_response_len=16, engine_version=1)
        assert sample.status is Status.COMPLETED and sample.response_ids == [7, 8, 9, 4, 2]


async def test_a_hung_engine_fails_the_request_as_unanswered_and_its_breaker_opens(start_engines) -> None:
    (engine,) = await start_engines()
    _hung(engine)
    downs = []
    async with HttpEnginePool([engine.url], config=TIMEOUTS, failure_threshold=2) as pool:
        pool.on_engine_down = lambda url, reason: downs.append((url, reason))
        for attempt in range(2):
            t0 = time.monotonic()
            with pytest.raises(EngineUnavailable, match=r"no answer after 1 attempts \(--max-retries 0\)") as info:
                await pool.generate([1], {}, rid=f"r{attempt}-")
            assert "request_timeout_s=0.2" in str(info.value)
            assert time.monotonic() - t0 < 0.2 + 0.3 + 0.3
        assert pool.engine_states()[0]["breaker"] == "open"
        assert downs and downs[0][0] == engine.url and "/generate" in downs[0][1]


async def test_give_up_inflight_ends_the_old_calls_of_a_hung_engine_and_takes_it_out(start_engines) -> None:
    hung, good = await start_engines(2)
    _hung(hung)
    good.on("/generate", body=generate_body())
    config = RolloutConfig(request_timeout_s=60, control_timeout_s=60, max_retries=0)
    async with HttpEnginePool([hung.url, good.url], config=config) as pool:
        call = asyncio.create_task(pool.generate([1], {}, rid="r-"))
        while pool.num_inflight == 0:
            await asyncio.sleep(0.01)
        assert pool.give_up_inflight("too young", running_for_s=30) == [] and not call.done()
        assert pool.give_up_inflight("still running 30s after abort_all") == [hung.url]
        result = await asyncio.wait_for(call, 1)
        assert result.aborted and result.output_ids == [] and "30s after abort_all" in result.finish_reason.message
        states = {s["url"]: s for s in pool.engine_states()}
        assert not states[hung.url]["in_rotation"] and states[good.url]["in_rotation"]
        assert pool.num_inflight == 0 and pool.give_up_inflight("again") == []
        assert not (await pool.generate([1], {})).aborted  # the other engine serves on


async def test_a_drain_over_a_hung_engine_ends_at_abort_timeout_s_and_the_engine_leaves_rotation(start_engines) -> None:
    from slime.config import LoopConfig
    from slime.data.dataset import PromptRow, PromptSource
    from slime.loop.buffer import DataBuffer
    from slime.loop.scheduler import Scheduler

    (engine,) = await start_engines()
    _hung(engine)  # answers neither /generate nor /abort_request, as a wedged GPU
    downs = []
    async with HttpEnginePool([engine.url], config=RolloutConfig(request_timeout_s=60, control_timeout_s=5)) as pool:
        pool.on_engine_down = lambda url, reason: downs.append(url)
        async with asyncio.TaskGroup() as tg:
            sched = Scheduler(
                LoopConfig(mode="sync", rollout_batch_size=1, over_sampling_batch_size=1, abort_timeout_s=0.3),
                RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=8),
                source=PromptSource([PromptRow(index=0, prompt="p")]),
                tokenize=lambda t: [1, 2],
                decode=lambda ids: "",
                pool=pool,
                buffer=DataBuffer(),
                reward_fn=lambda s: 1.0,
                task_group=tg,
            )
            batch = asyncio.create_task(sched.next_batch(1))
            while pool.num_inflight < 2:
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            await sched.shutdown()  # before the fix: RuntimeError "the engine does not honour /abort_request"
            batch.cancel()
        assert time.monotonic() - t0 < 3, "the drain waited on /abort_request past abort_timeout_s"
        assert downs == [engine.url] and not pool.engine_states()[0]["in_rotation"]
        assert sched.buffer.num_partial == 1
