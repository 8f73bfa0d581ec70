"""The main job with each weight-sync strategy, the engine in its own process (``--weight-sync``, ``--colocate``)."""

from __future__ import annotations

import json

import pytest

from slime.config import Config, DataConfig, EngineConfig, LoopConfig, RolloutConfig, SyncConfig, TrainConfig
from slime.loop.driver import run_training
from tests.e2e.test_main_job import count_w7
from tests.fixtures.tiny_model import write_tiny_llama


@pytest.mark.parametrize("method, colocate", [("distributed", False), ("delta", False), ("tensor", True)])
async def test_main_job_syncs_weights_with_each_strategy(tmp_path, method, colocate):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(32)) + "\n")
    config = Config(
        data=DataConfig(prompt_data=str(prompts), eval_prompt_data=str(prompts), num_eval_prompts=4),
        rollout=RolloutConfig(n_samples_per_prompt=4, rollout_max_response_len=16, request_timeout_s=60),
        loop=LoopConfig(mode="april", rollout_batch_size=2, over_sampling_batch_size=4, num_rollout=2),
        train=TrainConfig(lr=1e-3, global_batch_size=8, micro_batch_size=8),
        sync=SyncConfig(method=method, colocate=colocate, update_weight_buffer_size=16384),
        engine=EngineConfig(hf_checkpoint=str(model), startup_timeout_s=60),
        run_dir=str(tmp_path / "run"),
    )
    summary = await run_training(config, reward_fn=count_w7, progress=False)
    steps = [
        r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"
    ]
    assert [r["policy_version"] for r in steps] == [1, 2] and summary["final_policy_version"] == 2
    full_bytes = 4 * 22_688  # the tiny Llama, fp32
    for r in steps:
        assert r["weight_sync/seconds"] > 0
        if method == "delta":  # the engine's sha256 of every tensor it wrote matched ours: bit-exact across processes
            assert r["weight_sync/num_full_fallbacks"] == 0 and 0 < r["weight_sync/bytes"] < full_bytes
        else:
            assert r["weight_sync/bytes"] == full_bytes and r["weight_sync/num_buckets"] > 1  # 16 KiB buckets
