"""A request that gets no answer is a failed attempt of ``--max-retries``, never an abort that resumes
for ever; an abort from a weight update still resumes token-exactly and costs no attempt; an engine
that leaves rotation ends its requests at once; with no engine left, one line names each and why.

The engines are ``FakeEngine`` aiohttp servers (real sockets): a hung one accepts every request and
never answers it (``/generate`` and ``/abort_request`` alike, a wedged GPU).
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from slime.config import RolloutConfig
from slime.engines.pool import HttpEnginePool
from slime.errors import EngineUnavailable
from slime.rollout.generate import generate
from slime.types import Sample, Status
from tests.engines.test_client import dead_url, generate_body

NO_ANSWER = RolloutConfig(request_timeout_s=0.2, control_timeout_s=0.2, max_retries=1, retry_backoff_s=0.01)


def _hung(engine) -> None:
    """Accepts /generate, /abort_request and /health_generate and never answers them."""
    forever = asyncio.Event()

    async def stall(request: web.Request) -> web.Response:
        await forever.wait()
        return web.Response(status=200)

    engine.routes["/generate"] = engine.routes["/abort_request"] = engine.routes["/health_generate"] = stall


def _abort_body(rid: str, ids: tuple[int, ...]) -> dict:
    body = generate_body(rid, ids or (0,))
    body["output_ids"], body["meta_info"]["completion_tokens"] = list(ids), len(ids)
    body["meta_info"]["output_token_logprobs"] = [[-0.5, t, None] for t in ids]
    body["meta_info"]["finish_reason"] = {"type": "abort", "message": "Aborted"}
    return body


def _answers_aborts_with(engine, ids: tuple[int, ...]) -> None:
    """/generate runs until an /abort_request (by rid or abort_all) comes, then answers abort with ``ids``."""
    abort = asyncio.Event()

    async def gen(request: web.Request) -> web.Response:
        rid = (await request.json())["rid"]
        await abort.wait()
        return web.json_response(_abort_body(rid, ids))

    async def abort_request(request: web.Request) -> web.Response:
        abort.set()
        return web.Response(status=200)

    engine.routes["/generate"], engine.routes["/abort_request"] = gen, abort_request


def _rids(*engines) -> list[str]:
    return [body["rid"] for e in engines for _, path, body, _ in e.calls if path == "/generate"]


async def test_a_request_a_hung_engine_never_answers_is_retried_on_another_one_with_a_new_rid(start_engines) -> None:
    hung, good = await start_engines(2)
    _hung(hung)
    good.on("/generate", body=generate_body("x", (4, 2)))
    async with HttpEnginePool([hung.url, good.url], config=NO_ANSWER) as pool:
        result = await pool.generate([1, 2], {}, rid="slime-g0-s0-a0-r0-")
        states = {s["url"]: s for s in pool.engine_states()}
    # before: an abort result after the timeout (the sample resumed, --max-retries never applied)
    assert not result.aborted and result.output_ids == [4, 2]
    assert _rids(hung, good) == [
        "slime-g0-s0-a0-r0-",
        "slime-g0-s0-a0-r0-t1-",
    ]  # the hung engine may still hold the first
    assert states[hung.url]["consecutive_failures"] == 1 and states[good.url]["consecutive_failures"] == 0


async def test_a_sample_no_engine_answers_fails_after_max_retries_plus_one_attempts_and_is_not_resumed(
    start_engines,
) -> None:
    (hung,) = await start_engines()
    _hung(hung)
    config = RolloutConfig(request_timeout_s=0.2, control_timeout_s=0.2, max_retries=2, retry_backoff_s=0.01)
    async with HttpEnginePool([hung.url], config=config, failure_threshold=10) as pool:
        sample = await generate(Sample(prompt_ids=[1, 2]), {}, pool=pool, max_response_len=8, engine_version=0)
    assert sample.status is Status.FAILED and sample.num_aborts == 0  # before: PARTIAL, resumed again and again
    evidence = sample.evidence["generate_error"]
    assert evidence["transport"] is True and "no answer after 3 attempts (--max-retries 2)" in evidence["message"]
    assert hung.hits("/generate") == 3


async def test_a_timeout_answered_with_no_token_is_a_failed_attempt_and_one_with_tokens_resumes(start_engines) -> None:
    empty, good = await start_engines(2)
    _answers_aborts_with(empty, ())  # alive (it answers the abort) but it generated nothing in request_timeout_s
    good.on("/generate", body=generate_body("x", (4, 2)))
    async with HttpEnginePool([empty.url, good.url], config=NO_ANSWER) as pool:
        result = await pool.generate([1, 2], {}, rid="r-")
        assert not result.aborted and result.output_ids == [4, 2] and _rids(empty, good) == ["r-", "r-t1-"]
        assert pool.engine_states()[0]["consecutive_failures"] == 0, "it answered: not a failure of the engine"
    _answers_aborts_with(
        good, (7, 8)
    )  # a slow engine that answers the abort with tokens: kept, the sample resumes later
    async with HttpEnginePool([good.url], config=NO_ANSWER) as pool:
        sample = await generate(Sample(prompt_ids=[1, 2]), {}, pool=pool, max_response_len=8, engine_version=0)
    assert sample.status is Status.PARTIAL and sample.response_ids == [7, 8] and _rids(good)[-1] == "slime-g0-s0-a0-r0-"


async def test_an_abort_from_a_weight_update_resumes_token_exactly_and_costs_no_attempt(start_engines) -> None:
    (engine,) = await start_engines()
    _answers_aborts_with(engine, (7, 8, 9))
    config = RolloutConfig(request_timeout_s=30, control_timeout_s=5, max_retries=0)
    async with HttpEnginePool([engine.url], config=config) as pool:
        sample = Sample(prompt_ids=[1, 2])
        call = asyncio.create_task(generate(sample, {}, pool=pool, max_response_len=8, engine_version=0))
        while engine.hits("/generate") == 0:
            await asyncio.sleep(0.01)
        await pool.abort_all()  # what a weight update does
        await asyncio.wait_for(call, 5)
        assert sample.status is Status.PARTIAL and sample.response_ids == [7, 8, 9] and sample.num_aborts == 1
        engine.on("/generate", body=generate_body("x", (4, 2)))
        await generate(sample, {}, pool=pool, max_response_len=8, engine_version=1)
    assert sample.status is Status.COMPLETED and sample.response_ids == [7, 8, 9, 4, 2]
    resent = [body for _, path, body, _ in engine.calls if path == "/generate"][-1]
    assert (
        resent["input_ids"] == [1, 2, 7, 8, 9] and resent["rid"] == "slime-g0-s0-a1-r1-"
    )  # no retry suffix: not a failure


@pytest.mark.parametrize("how", ["take_out", "breaker", "trip"])
async def test_requests_on_an_engine_that_leaves_rotation_end_at_once_and_are_retried_elsewhere(
    start_engines, how
) -> None:
    hung, good = await start_engines(2)
    _hung(hung)
    good.on("/generate", body=generate_body("x", (4, 2)))
    config = RolloutConfig(request_timeout_s=60, control_timeout_s=60, max_retries=1, retry_backoff_s=0.01)
    async with HttpEnginePool([hung.url, good.url], config=config, failure_threshold=1) as pool:
        call = asyncio.create_task(pool.generate([1], {}, rid="r-"))
        while hung.hits("/generate") == 0:
            await asyncio.sleep(0.01)
        if how == "take_out":
            pool.take_out(hung.url, "no answer to /health_generate within 0.5s")
        elif how == "breaker":
            pool.record_failure(hung.url, "no answer to /health_generate within 0.5s")
        else:
            pool.trip(hung.url, "process embedded-seed0 (pid 1) exited with code -9")
        result = await asyncio.wait_for(call, 5)  # before: held until request_timeout_s + control_timeout_s (120 s)
    assert result.output_ids == [4, 2] and _rids(good) == ["r-t1-"]


async def test_with_no_engine_left_a_generate_ends_with_one_line_naming_each_engine_and_why(start_engines) -> None:
    (hung,) = await start_engines()
    _hung(hung)
    dead = dead_url()
    async with HttpEnginePool([hung.url, dead], config=NO_ANSWER, rejoin_timeout_s=0.3) as pool:
        pool.record_failure(hung.url, "no answer to /health_generate within 0.5s")
        pool.take_out(hung.url, "circuit breaker open")
        pool.take_out(dead, "update_weights_from_disk('/w/v1', weight_version='1') failed: connection failed")
        with pytest.raises(EngineUnavailable) as info:
            await pool.generate([1], {})
        together = await asyncio.gather(*(pool.generate([1], {}) for _ in range(8)), return_exceptions=True)
    message = str(info.value)
    assert {str(e) for e in together} == {message}  # the calls that gave up together: one diagnosis, one message
    assert type(info.value).__name__ == "EnginesGone" and "\n" not in message
    assert message.startswith("no engine left to serve /generate (none came back within 0.3s): ")
    assert (
        f"engine {dead}: dead (connection refused: nothing listens there)" in message
        and "update_weights" not in message
    )
    assert f"engine {hung.url}: no answer to /health_generate within 0.5s (no successful answer for " in message


async def test_an_engine_given_up_on_for_good_ends_a_waiting_generate_at_once(start_engines) -> None:
    (engine,) = await start_engines()
    async with HttpEnginePool([engine.url], config=NO_ANSWER, rejoin_timeout_s=60) as pool:
        pool.take_out(engine.url, "restarting it")
        call = asyncio.create_task(pool.generate([1], {}))
        await asyncio.sleep(0.05)
        assert not call.done()  # waits for the restart
        pool.retire(
            engine.url, "process embedded-seed0 (pid 7) exited with code -9; not restarted again after 3 restarts"
        )
        with pytest.raises(EngineUnavailable) as info:
            await asyncio.wait_for(call, 5)
    message = str(info.value)
    assert type(info.value).__name__ == "EnginesGone" and "(every one was given up on)" in message
    assert f"engine {engine.url}: dead (connection refused: nothing listens there)" not in message  # it still listens
    assert "exited with code -9; not restarted again after 3 restarts" in message


async def test_a_weight_update_that_must_reach_every_engine_names_a_killed_one_dead(start_engines) -> None:
    (alive,) = await start_engines()
    alive.on("/update_weights_from_tensor", body={"success": True, "message": "ok"})
    dead = dead_url()
    async with HttpEnginePool([alive.url, dead], config=NO_ANSWER) as pool:
        with pytest.raises(EngineUnavailable) as info:
            await pool.update_weights_from_tensor(["payload"], weight_version="1")
        assert [c.url for c in pool.clients] == [alive.url]  # it missed the update: out of rotation
    message = str(info.value)
    assert (
        "failed on 1 of 2 engines" in message and f"{dead}: dead (connection refused: nothing listens there)" in message
    )
