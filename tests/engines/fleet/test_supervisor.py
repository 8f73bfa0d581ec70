"""EngineSupervisor and the pool's failure handling, against in-process fake engines and fake processes.

The engines are ``FakeEngine`` aiohttp servers (canned SGLang replies, every call recorded); the
processes are ``FakeProcess`` objects whose ``restart`` only counts. No model, no subprocess.
"""

from __future__ import annotations

import asyncio

import pytest

from slime.config import EngineConfig, RolloutConfig
from slime.engines.fleet.supervisor import EngineSupervisor
from slime.engines.pool import HttpEnginePool
from slime.errors import EngineRequestError, EngineUnavailable
from slime.rollout.generate import generate
from slime.types import Sample, Status
from tests.engines.test_client import FakeEngine, dead_url, generate_body

FAST = RolloutConfig(request_timeout_s=5.0, control_timeout_s=5.0, max_retries=2, retry_backoff_s=0.01)
SUPERVISE = EngineConfig(
    health_check_interval_s=0.02,
    health_check_timeout_s=1.0,
    circuit_breaker_threshold=2,
    circuit_breaker_cooldown_s=0.02,
    max_engine_restarts=2,
    startup_timeout_s=5.0,
)


class FakeProcess:
    def __init__(self, name: str, *, failing_restarts: int = 0):
        self.name, self.pid, self.returncode = name, 100, None
        self.num_restarts, self.failing_restarts = 0, failing_restarts

    async def restart(self, startup_timeout_s: float) -> str:
        self.num_restarts += 1
        if self.num_restarts <= self.failing_restarts:
            raise EngineUnavailable("did not come up", endpoint="(launch)")
        self.pid, self.returncode = self.pid + 1, None
        return self.name


def serving(engine: FakeEngine, version: str) -> None:
    engine.on("/health_generate", text="")
    engine.on("/model_info", body={"model_path": "/ckpt", "weight_version": version})
    engine.on("/update_weights_from_disk", body={"success": True, "message": "ok", "num_paused_requests": 0})
    engine.on("/generate", body=generate_body())


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def in_rotation(pool: HttpEnginePool) -> list[str]:
    return [c.url for c in pool.clients]


async def test_failing_health_checks_sideline_an_external_engine_until_it_answers_then_it_is_resynced(start_engines):
    good, flaky = await start_engines(2)
    serving(good, "3")
    serving(flaky, "0")
    flaky.on("/health_generate", status=503, text="")
    async with HttpEnginePool(
        [good.url, flaky.url], config=FAST, weights=("/ckpt/v0", "0"), failure_threshold=2
    ) as pool:
        await pool.update_weights_from_disk("/ckpt/v3", "3")
        supervisor = EngineSupervisor(pool, config=SUPERVISE)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(supervisor.run())
            await until(lambda: in_rotation(pool) == [good.url])
            assert [(e[0], e[1]) for e in supervisor.events] == [("down", flaky.url)]
            await pool.generate([1], {})  # goes to the engine in rotation, without waiting
            assert good.hits("/generate") == 1 and flaky.hits("/generate") == 0
            flaky.on("/health_generate", text="")  # it answers again, holding version 0
            await until(lambda: in_rotation(pool) == [good.url, flaky.url])
            supervisor.close()
    updates = [c[2] for c in flaky.calls if c[1] == "/update_weights_from_disk"]
    assert updates[-1]["model_path"] == "/ckpt/v3" and updates[-1]["weight_version"] == "3"
    assert supervisor.events[-1][:2] == ("rejoined", flaky.url)


async def test_an_exited_process_is_restarted_resynced_and_put_back(start_engines):
    a, b = await start_engines(2)
    serving(a, "2")
    serving(b, "0")  # what a freshly started server reports
    async with HttpEnginePool([a.url, b.url], config=FAST, weights=("/ckpt/v2", "2")) as pool:
        proc = FakeProcess("b")
        supervisor = EngineSupervisor(
            pool, config=EngineConfig(health_check_interval_s=0, startup_timeout_s=5.0), processes={b.url: proc}
        )
        proc.returncode = -9
        async with asyncio.TaskGroup() as tg:
            await supervisor.check_once(tg)
            assert in_rotation(pool) == [a.url]
            await supervisor.wait_idle()
    assert proc.num_restarts == 1 and in_rotation(pool) == [a.url, b.url]
    assert [c[2]["weight_version"] for c in b.calls if c[1] == "/update_weights_from_disk"] == ["2"]
    assert [e[0] for e in supervisor.events] == ["down", "restarted"] and "100 -> 101" in supervisor.events[-1][2]


async def test_an_engine_whose_restarts_keep_failing_is_given_up_and_the_rest_keep_serving(start_engines):
    a, b = await start_engines(2)
    serving(a, "0")
    serving(b, "0")
    async with HttpEnginePool([a.url, b.url], config=FAST, weights=("/ckpt/v0", "0")) as pool:
        proc = FakeProcess("b", failing_restarts=99)
        supervisor = EngineSupervisor(pool, config=SUPERVISE, processes={b.url: proc})
        proc.returncode = 1
        async with asyncio.TaskGroup() as tg:
            await supervisor.check_once(tg)
            await supervisor.wait_idle()
        for _ in range(3):
            await pool.generate([1], {})
    assert proc.num_restarts == 2 and supervisor.given_up == {b.url} and supervisor.events[-1][0] == "gave_up"
    assert in_rotation(pool) == [a.url] and (a.hits("/generate"), b.hits("/generate")) == (3, 0)


async def test_when_the_last_engine_is_given_up_a_waiting_generate_ends_at_once_naming_its_exit(start_engines):
    (engine,) = await start_engines()
    serving(engine, "0")
    async with HttpEnginePool([engine.url], config=FAST, weights=("/ckpt/v0", "0"), rejoin_timeout_s=60) as pool:
        proc = FakeProcess("embedded-seed0", failing_restarts=99)
        supervisor = EngineSupervisor(pool, config=SUPERVISE, processes={engine.url: proc})
        proc.returncode = -9
        async with asyncio.TaskGroup() as tg:
            await supervisor.check_once(tg)
            call = asyncio.create_task(pool.generate([1], {}))
            with pytest.raises(
                EngineUnavailable
            ) as info:  # before: waited rejoin_timeout_s (60 s) after the last restart
                await asyncio.wait_for(call, 5)
            await supervisor.wait_idle()
    message = str(info.value)
    assert type(info.value).__name__ == "EnginesGone" and proc.num_restarts == 2 and "\n" not in message
    assert f"engine {engine.url}: process embedded-seed0 (pid 100) exited with code -9" in message
    assert "not restarted again after 2 restarts (--max-engine-restarts)" in message


async def test_a_retry_resends_prompt_and_partial_tokens_and_the_sample_only_changes_on_success(start_engines):
    bad, good = await start_engines(2)
    bad.on("/generate", status=503, body={"object": "error", "message": "engine died", "code": 503})
    good.on("/generate", body=generate_body(ids=(7, 1)))
    sample = Sample(prompt_ids=[3, 4], group_id=5, index=0)
    sample.append([9, 9], [-0.1, -0.2], 0)
    sample.status, sample.num_aborts = Status.PARTIAL, 1
    async with HttpEnginePool([bad.url, good.url], config=FAST) as pool:
        await generate(sample, {"temperature": 1.0}, pool=pool, max_response_len=8, engine_version=1)
    sent_bad, sent_good = bad.calls[0][2], good.calls[0][2]
    assert sent_bad["input_ids"] == sent_good["input_ids"] == [3, 4, 9, 9] and sent_bad["rid"] == sent_good["rid"]
    assert sent_good["sampling_params"]["max_new_tokens"] == 6
    assert sample.response_ids == [9, 9, 7, 1] and sample.versions == [0, 0, 1, 1] and sample.status is Status.COMPLETED


async def test_abort_all_ends_a_call_that_waits_for_an_engine_to_rejoin(start_engines):
    (engine,) = await start_engines()
    serving(engine, "0")
    engine.on("/abort_request", text="")
    async with HttpEnginePool([engine.url], config=FAST, rejoin_timeout_s=30.0) as pool:
        pool.take_out(engine.url, "restarting")
        waiting = asyncio.create_task(pool.generate([1], {}, rid="r1"))
        await settle()  # the call now waits for a worker
        await pool.abort_all()
        result = await asyncio.wait_for(waiting, 1.0)
    assert result.finish_reason.type == "abort" and result.output_ids == [] and engine.hits("/generate") == 0


async def test_a_waiting_call_goes_out_when_the_engine_rejoins_and_a_paused_pool_pauses_it_first(start_engines):
    (engine,) = await start_engines()
    serving(engine, "0")
    engine.on("/pause_generation", body={"message": "paused", "status": "ok"})
    async with HttpEnginePool([engine.url], config=FAST, rejoin_timeout_s=30.0, weights=("/ckpt/v0", "0")) as pool:
        pool.take_out(engine.url, "restarting")
        await pool.pause_generation("in_place")
        waiting = asyncio.create_task(pool.generate([1], {}))
        await settle()
        await pool.rejoin(engine.url)
        await asyncio.wait_for(waiting, 1.0)
    paths = [c[1] for c in engine.calls]
    assert paths == ["/model_info", "/pause_generation", "/generate"]


async def test_a_weight_update_takes_an_unreachable_engine_out_and_rejoin_refuses_unsaved_weights(start_engines):
    (good,) = await start_engines()
    serving(good, "1")
    down = dead_url()
    async with HttpEnginePool([good.url, down], config=FAST, weights=("/ckpt/v0", "0")) as pool:
        await pool.update_weights_from_disk("/ckpt/v1", "1")
        assert in_rotation(pool) == [good.url]
        pool.latest_version = "2"  # as after a tensor/NCCL update: nothing on disk to replay
        with pytest.raises(EngineRequestError, match="not written to disk"):
            await pool.rejoin(good.url)


async def test_no_health_probe_reaches_an_engine_while_the_pool_is_paused_or_its_memory_released(start_engines):
    (engine,) = await start_engines()
    serving(engine, "0")
    engine.on("/pause_generation", body={"message": "paused", "status": "ok"})
    engine.on("/release_memory_occupation", body=None)
    async with HttpEnginePool([engine.url], config=FAST) as pool:
        supervisor = EngineSupervisor(pool, config=SUPERVISE)
        async with asyncio.TaskGroup() as tg:
            await pool.pause_generation("in_place")
            await supervisor.check_once(tg)
            pool.paused_mode = None
            await pool.release_memory_occupation()
            await supervisor.check_once(tg)
    assert engine.hits("/health_generate") == 0 and supervisor.events == []


async def test_rejoin_follows_the_version_the_other_engines_hold_even_if_the_pool_did_not_push_it(start_engines):
    a, b = await start_engines(2)
    serving(a, "5")  # e.g. after delta syncs that went to the clients directly
    serving(b, "0")
    async with HttpEnginePool([a.url, b.url], config=FAST, weights=("/ckpt/v0", "0")) as pool:
        pool.take_out(b.url, "restarting")
        with pytest.raises(EngineRequestError, match="the current one, '5', was not written to disk"):
            await pool.rejoin(b.url)
        pool.weights = ("/ckpt/v5", "5")
        await pool.rejoin(b.url)
        assert in_rotation(pool) == [a.url, b.url]
    assert [c[2]["model_path"] for c in b.calls if c[1] == "/update_weights_from_disk"] == ["/ckpt/v5"]
