"""Every run that trains ends with its model in ``RUN_DIR/model`` (HF: config, tokenizer, safetensors), named by
``summary.json``'s ``model_dir``, whatever ``--weight-sync`` and without ``--save-interval`` (issue 31 item 2). The SFT
run's is tests/loop/test_sft_driver.py's."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slime.config import Config, DataConfig, EngineConfig, LoopConfig, RolloutConfig, SyncConfig, TrainConfig
from slime.loop.driver import run_training
from tests.fixtures.tiny_model import write_tiny_llama


async def odd_letters(sample) -> float:
    """A reward that differs between a group's samples (so GRPO's advantages, and the update, are not zero)."""
    return float(sum(map(ord, sample.response)) % 2)


@pytest.mark.parametrize("method, colocate", [("disk", False), ("tensor", True)])
async def test_an_rl_run_writes_its_trained_model_as_an_hf_directory(tmp_path, method, colocate):
    base = write_tiny_llama(tmp_path / "base", seed=0, with_tokenizer=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(16)) + "\n")
    config = Config(
        data=DataConfig(prompt_data=str(prompts)),
        rollout=RolloutConfig(n_samples_per_prompt=4, rollout_max_response_len=8, request_timeout_s=60),
        loop=LoopConfig(mode="sync", rollout_batch_size=2, num_rollout=1, skip_eval_before_train=True),
        train=TrainConfig(lr=1e-2, global_batch_size=8, micro_batch_size=8),
        sync=SyncConfig(method=method, colocate=colocate),
        engine=EngineConfig(hf_checkpoint=str(base), startup_timeout_s=60),
        run_dir=str(tmp_path / "run"),
    )
    summary = await run_training(config, reward_fn=odd_letters, progress=False)
    model_dir = tmp_path / "run" / "model"
    assert summary["model_dir"] == str(model_dir)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["model_dir"] == str(model_dir)
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "config.json").is_file()
    trained = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer("w3 w4")["input_ids"] == AutoTokenizer.from_pretrained(base)("w3 w4")["input_ids"]
    start = AutoModelForCausalLM.from_pretrained(base).state_dict()
    moved = [name for name, t in trained.state_dict().items() if not torch.equal(t, start[name])]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert moved, f"the saved model is the base model: the trained weights were not written ({steps})"
