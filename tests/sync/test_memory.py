"""Memory release / resume on the embedded engine (docs/sglang.md#memory): freed weights, held generation, re-sync needed."""

from __future__ import annotations

import asyncio

import pytest

from slime.config import SyncConfig
from slime.errors import EngineRequestError
from slime.sync.tensor import TensorWeightSync
from tests.sync.conftest import GREEDY, assert_holds, greedy_outputs, live_state


async def test_release_frees_weights_holds_generation_and_resume_needs_a_resync(engine, pool, v1_path):
    client = pool.clients[0]
    v1 = {n: t.clone() for n, t in live_state(engine).items()}
    expected = await greedy_outputs(client)
    await pool.release_memory_occupation()
    assert all(p.numel() == 0 for p in engine.loaded.model.parameters())
    held = asyncio.create_task(client.generate([0, 5, 9, 3], GREEDY, return_logprob=False))
    with pytest.raises(EngineRequestError, match="memory is released"):
        await client.continue_generation()
    with pytest.raises(EngineRequestError, match="memory is released"):
        await client.update_weights_from_disk(str(v1_path), weight_version="x")
    await pool.resume_memory_occupation()
    assert all(p.abs().sum() == 0 for p in engine.loaded.model.parameters())  # re-mapped, not restored
    await held  # generation went on once memory came back (on zero weights: its tokens are meaningless)
    sync = TensorWeightSync(SyncConfig(), pool=pool, state_fn=lambda: v1)
    await sync.load(await sync.save(1), 1)
    assert_holds(engine, v1)
    assert await greedy_outputs(client) == expected


async def test_release_needs_an_idle_engine_and_tags_can_come_back_one_by_one(engine, pool):
    client = pool.clients[0]
    await client.pause_generation("in_place")
    task = asyncio.create_task(client.generate([0, 5, 9], GREEDY, return_logprob=False))
    while not engine.inflight:
        await asyncio.sleep(0.001)
    with pytest.raises(EngineRequestError, match="needs an idle engine"):
        await client.release_memory_occupation()
    await client.continue_generation()
    await task
    await client.release_memory_occupation(["kv_cache"])
    assert engine.runner.paused and all(p.numel() > 0 for p in engine.loaded.model.parameters())
    await client.release_memory_occupation(["weights"])
    await client.resume_memory_occupation(["kv_cache"])
    assert engine.runner.paused  # weights are still out
    await client.resume_memory_occupation(["weights"])
    assert not engine.runner.paused
    with pytest.raises(EngineRequestError, match="tags must be"):
        await client.release_memory_occupation(["gpu"])
