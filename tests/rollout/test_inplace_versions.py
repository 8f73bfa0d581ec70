"""In-place updates and the prefix cache (SGLang 0.5.17, docs/ARCHITECTURE.md):

- an update while requests are paused in place never asks the engine to flush its cache (0.5.17
  dies on it; the embedded engine dies the same way, so the main job's async path is checked here);
- KV computed by older weights survives such an update, so tokens of a request that reused cached
  KV are tagged no newer than the pool's ``kv_cache_version``;
- without ``weight_versions`` spans (0.5.17) every token of a request carries the older of
  (reported weight_version, version at send);
- async mode aborts and flushes at each update once requests reuse cached KV (else the tag of every
  later cache hit would lag further behind with each in-place update).
"""

from __future__ import annotations

import asyncio
import types

import pytest

from slime.config import RolloutConfig, SyncConfig
from slime.engines.pool import HttpEnginePool
from slime.engines.protocol import FinishReason, GenerateResult
from slime.loop.step import pause_mode
from slime.rollout.generate import generate, token_versions
from slime.servers.embedded import EngineServer
from slime.sync.disk import DiskWeightSync
from slime.types import Sample
from tests.fixtures.tiny_model import perturb_weights, write_tiny_llama

CONFIG = RolloutConfig(request_timeout_s=60, max_retries=1, retry_backoff_s=0.01)


def _result(
    n: int, *, weight_version: str = "5", spans: list[str] | None = None, cached: int | None = 0
) -> GenerateResult:
    return GenerateResult(
        output_ids=list(range(n)),
        output_logprobs=[-0.1] * n,
        finish_reason=FinishReason(type="length", length=n),
        weight_version=weight_version,
        token_weight_versions=spans,
        cached_tokens=cached,
    )


def test_without_spans_every_token_carries_the_older_of_reported_and_sent_version():
    assert token_versions(_result(3, weight_version="5"), engine_version=4) == 4
    assert token_versions(_result(3, weight_version="3"), engine_version=4) == 3
    assert token_versions(_result(3, weight_version="default"), engine_version=4) == 4


def test_spans_give_per_token_versions():
    assert token_versions(_result(3, spans=["3", "3", "4"]), engine_version=4) == [3, 3, 4]


@pytest.mark.parametrize("cached, expected", [(0, [3, 3, 4]), (9, [2, 2, 2]), (None, [2, 2, 2])])
def test_a_request_that_reused_cached_kv_is_tagged_no_newer_than_the_cache(cached, expected):
    r = _result(3, spans=["3", "3", "4"], cached=cached)
    assert token_versions(r, engine_version=4, kv_cache_version=2) == expected
    assert token_versions(_result(3, cached=cached), engine_version=4, kv_cache_version=2) == (4 if cached == 0 else 2)
    assert token_versions(r, engine_version=4, kv_cache_version=None) == [3, 3, 4]


@pytest.mark.parametrize(
    "kv, hits, expected",
    [
        ("3", 1, "abort"),  # a request reused cached KV: in-place updates would tag later hits ever older
        ("3", 0, "in_place"),  # no request reused the cache (no prefix cache, or --disable-radix-cache)
        (None, 1, "in_place"),  # unknown cache state (never flushed by us): tags are not lowered either
    ],
)
def test_async_mode_aborts_and_flushes_once_requests_reuse_cached_kv(kv, hits, expected):
    pool = types.SimpleNamespace(kv_cache_version=kv, num_prefix_cache_hits=hits)
    config = types.SimpleNamespace(mode="async", max_staleness=4)
    assert pause_mode(config, pool, 7) == expected
    assert pause_mode(types.SimpleNamespace(mode="april", max_staleness=2), pool, 7) == "abort"
    assert pause_mode(config, pool, 7, colocate=True) == "abort"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("inplace")
    v0 = write_tiny_llama(root / "v0", seed=0)
    return v0, perturb_weights(v0, root / "v1", seed=1)


async def test_pool_tracks_when_the_prefix_cache_was_last_emptied(models):
    v0, v1 = models
    async with EngineServer(v0, port=0, seed=0, weight_version="0") as server:
        async with HttpEnginePool([server.url], config=CONFIG, weights=(str(v0), "0")) as pool:
            assert pool.kv_cache_version == "0"
            await pool.update_weights_from_disk(str(v1), "1", flush_cache=False)
            assert (pool.kv_cache_version, pool.latest_version) == ("0", "1")
            pool.num_prefix_cache_hits = 3
            assert await pool.flush_cache() == {server.url: True}
            assert (pool.kv_cache_version, pool.num_prefix_cache_hits) == ("1", 0)
            await pool.update_weights_from_disk(str(v0), "2", flush_cache=True)
            assert pool.kv_cache_version == "2"


async def test_in_place_disk_update_with_a_request_in_flight_keeps_the_engine_alive_and_versions_the_tokens(
    models, tmp_path
):
    v0, v1 = models
    async with EngineServer(v0, port=0, seed=0, weight_version="0") as server:
        async with HttpEnginePool([server.url], config=CONFIG, weights=(str(v0), "0")) as pool:
            sync = DiskWeightSync(
                SyncConfig(weights_dir=str(tmp_path / "w")),
                pool=pool,
                save_fn=lambda out: __import__("shutil").copytree(v1, out),
            )
            staged = await sync.save(1)
            s = Sample(prompt_ids=[0, 5, 9, 17, 3])
            task = asyncio.create_task(
                generate(s, {"ignore_eos": True}, pool=pool, max_response_len=200, engine_version=0)
            )
            while not server.runner.num_running:
                await asyncio.sleep(0.005)
            await pool.pause_generation("in_place")
            await sync.load(staged, 1, abort_all_requests=False)  # flush_cache false: the engine lives
            await pool.continue_generation()
            await task
            assert len(s.response_ids) == 200 and s.versions[0] == 0 and set(s.versions) <= {0, 1}
            assert await pool.clients[0].health_generate()
            assert (await pool.clients[0].model_info())["weight_version"] == "1"
            assert pool.kv_cache_version == "0"  # KV of version 0 may survive in the cache
