"""Distributed weight sync: the trainer (this process) and the embedded engine join a gloo group."""

from __future__ import annotations

import pytest

from slime.config import RolloutConfig, SyncConfig
from slime.engines.pool import HttpEnginePool
from slime.servers.embedded import EngineServer
from slime.sync.distributed import DistributedWeightSync, sglang_version
from tests.sync.conftest import assert_holds, greedy_outputs


@pytest.mark.parametrize("load_format, buffer_size", [(None, 512 << 20), ("flattened_bucket", 4096)])
async def test_broadcast_weights_arrive_bit_exact_and_generate_like_a_disk_synced_engine(
    engine, pool, v1_path, v2_path, v2_state, load_format, buffer_size
):
    sync = DistributedWeightSync(
        SyncConfig(update_weight_buffer_size=buffer_size),
        pool=pool,
        state_fn=lambda: dict(v2_state),
        load_format=load_format,
    )
    before = await greedy_outputs(pool.clients[0])
    await sync.load(await sync.save(1), 1)
    assert_holds(engine, v2_state)
    assert engine.weight_version == "1"
    assert sync.stats["num_buckets"] == (1 if buffer_size > 1 << 20 else 17)
    assert sync.stats["bytes"] == sum(t.numel() * t.element_size() for t in v2_state.values())
    async with (
        EngineServer(v1_path, port=0, seed=0) as disk_engine,
        HttpEnginePool([disk_engine.url], config=RolloutConfig()) as disk_pool,
    ):
        await disk_pool.update_weights_from_disk(str(v2_path), weight_version="1")
        after = await greedy_outputs(pool.clients[0])
        assert after == await greedy_outputs(disk_pool.clients[0]) and after != before
    await sync.close()


async def test_the_group_is_kept_across_syncs_and_rebuilt_after_close(engine, pool, v2_state):
    state = dict(v2_state)
    sync = DistributedWeightSync(SyncConfig(), pool=pool, state_fn=lambda: dict(state))
    await sync.load(await sync.save(1), 1)
    group = sync._group
    state["lm_head.weight"] = state["lm_head.weight"] * 2
    await sync.load(await sync.save(2), 2)
    assert sync._group is group and engine.weight_version == "2"
    assert_holds(engine, state)
    await sync.close()
    await sync.close()  # idempotent
    await sync.load(await sync.save(3), 3)
    assert sync._group is not group and engine.weight_version == "3"
    await sync.close()


def test_sglang_versions_parse_from_server_info():
    assert sglang_version({"version": "0.5.6.post2"}) == (0, 5, 6)
    assert sglang_version({"version": "0.5.23"}) >= (0, 5, 6) > sglang_version({"version": "0.5.2"})
    assert sglang_version({}) == ()
