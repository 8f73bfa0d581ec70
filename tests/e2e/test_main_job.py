"""The whole main job, small: embedded engine subprocess, APRIL scheduler, torch trainer, disk sync."""

from __future__ import annotations

import json

import msgspec
import pytest

from slime.config import Config, DataConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.loop.driver import run_training
from tests.fixtures.tiny_model import write_tiny_llama


async def count_w7(sample):
    """Reward: fraction of response tokens that are the word w7 (learnable by a random tiny model)."""
    words = sample.response.split()
    return sum(w == "w7" for w in words) / max(1, len(words))


@pytest.mark.parametrize("mode, newest_only", [("april", False), ("async", False), ("april", True)])
async def test_main_job_runs_end_to_end_and_writes_its_outputs(tmp_path, mode, newest_only):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(64)) + "\n")
    config = Config(
        data=DataConfig(prompt_data=str(prompts), eval_prompt_data=str(prompts), num_eval_prompts=8),
        # with newest_only: answers long enough to be aborted mid-way and resumed under the next version
        rollout=RolloutConfig(
            n_samples_per_prompt=4, rollout_max_response_len=96 if newest_only else 24, request_timeout_s=60
        ),
        loop=LoopConfig(mode=mode, rollout_batch_size=4, over_sampling_batch_size=8, num_rollout=3, max_staleness=2),
        train=TrainConfig(
            lr=1e-3, global_batch_size=16, micro_batch_size=8, mask_offpolicy_in_partial_rollout=newest_only
        ),
        engine=EngineConfig(hf_checkpoint=str(model), startup_timeout_s=60),
        run_dir=str(tmp_path / "run"),
    )
    summary = await run_training(config, reward_fn=count_w7, progress=False)
    run = tmp_path / "run"
    assert (run / "summary.json").exists() and (run / "reward_curve.png").stat().st_size > 1000
    assert "eval" in (run / "report.txt").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3] and [r["policy_version"] for r in steps] == [1, 2, 3]
    assert summary["groups_trained"] == 12 and summary["final_policy_version"] == 3
    for key in (
        "eval_accuracy_before",
        "eval_accuracy_after",
        "aborted_samples",
        "resumed_samples",
        "max_versions_in_a_trained_sample",
    ):
        assert key in summary
    assert all(r["train/num_optimizer_steps"] == 1 for r in steps)
    # the loop's count of trained tokens is what the trainer trained (masks included)
    assert [r["trained_tokens"] for r in steps] == [r["train/num_train_tokens"] for r in steps]
    assert [sum(r["lag_histogram"].values()) for r in steps] == [r["trained_tokens"] for r in steps]
    if newest_only:  # the mask had tokens to take: resumed samples straddled a weight update
        assert sum(r["multi_version_samples"] for r in steps) > 0 and sum(r["masked_stale_tokens"] for r in steps) > 0
    assert msgspec.json.decode((run / "config.json").read_bytes())["loop"]["mode"] == mode
