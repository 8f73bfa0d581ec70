"""THUDM/slime's --skip-eval-before-train and --eval-top-k, from the CLI through the driver's eval records."""

from __future__ import annotations

import json

import pytest

from slime.cli.args import build_parser, config_from_args
from slime.config import Config, DataConfig, DebugConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import ConfigError
from slime.loop import assemble
from slime.loop.driver import run_training
from tests.fixtures.fake_pool import run_on_a_recording_fake_pool
from tests.fixtures.tiny_model import write_tiny_llama


def parse(*argv: str) -> Config:
    return config_from_args(build_parser().parse_args(["--rollout-batch-size", "1", "--global-batch-size", "8", *argv]))


def test_the_flags_reach_their_fields_and_eval_top_k_defaults_to_the_rollouts():
    c = parse("--skip-eval-before-train", "--rollout-top-k", "20")
    assert c.loop.skip_eval_before_train and c.rollout.resolved_eval_top_k == 20
    assert parse("--rollout-top-k", "20", "--eval-top-k", "1").rollout.resolved_eval_top_k == 1
    with pytest.raises(ConfigError, match=r"^--eval-top-k=0 is invalid"):
        parse("--eval-top-k", "0")


@pytest.mark.parametrize("skip", [True, False])
async def test_a_run_skips_the_eval_before_training_and_samples_eval_at_eval_top_k(tmp_path, monkeypatch, skip):
    seen = run_on_a_recording_fake_pool(monkeypatch, assemble)

    async def reward(sample):
        return 1.0

    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "w5 w6", "label": "x"}) + "\n")
    config = Config(
        data=DataConfig(prompt_data=str(prompts), eval_prompt_data=str(prompts)),
        rollout=RolloutConfig(n_samples_per_prompt=2, eval_top_k=1, rollout_max_response_len=4),
        loop=LoopConfig(rollout_batch_size=1, over_sampling_batch_size=1, num_rollout=1, skip_eval_before_train=skip),
        train=TrainConfig(global_batch_size=2, micro_batch_size=2),
        engine=EngineConfig(hf_checkpoint=str(model)),
        debug=DebugConfig(debug_rollout_only=True),
        run_dir=str(tmp_path / "run"),
    )
    summary = await run_training(config, reward_fn=reward, progress=False)
    evals = [
        r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"
    ]
    assert [r["step"] for r in evals] == ([1] if skip else [0, 1])
    assert (summary["eval_accuracy_before"] is None) == skip and summary["eval_accuracy_after"] == 1.0
    # one eval ran: before the first step, or (skipped) after the last; the rollout's requests run at --rollout-top-k -1
    eval_calls = [p for _, p in seen if p.get("top_k") == 1]
    assert len(eval_calls) == 1 and all(p["temperature"] == 0.0 for p in eval_calls)
