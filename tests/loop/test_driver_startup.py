"""What a run does before its first step: bad prompts are refused at load, and a start that fails
leaves nothing that blocks running again with the same ``--save``."""

from __future__ import annotations

import json
import socket

import pytest

from slime.config import Config, DataConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import DataError, EngineError
from slime.loop.driver import run_training
from tests.fixtures.tiny_model import write_tiny_llama


def _config(tmp_path, prompts, **engine_kw):
    model = tmp_path / "model"
    if not model.exists():
        write_tiny_llama(model, seed=0, with_tokenizer=True)  # context 256
    return Config(
        data=DataConfig(prompt_data=str(prompts)),
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=8),
        loop=LoopConfig(mode="sync", rollout_batch_size=1, over_sampling_batch_size=1, num_rollout=1),
        train=TrainConfig(global_batch_size=2, micro_batch_size=2),
        engine=EngineConfig(hf_checkpoint=str(model), **engine_kw),
        run_dir=str(tmp_path / "run"),
    )


async def test_a_prompt_longer_than_the_model_context_is_refused_at_load_by_file_and_line(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "w3 w9"}) + "\n" + json.dumps({"prompt": " ".join(["w5"] * 400)}) + "\n")
    with pytest.raises(DataError, match=rf"{prompts}:2: the prompt renders to 40\d tokens, the model's context of 256"):
        await run_training(_config(tmp_path, prompts), reward_fn=lambda s: 0.0, progress=False)


async def test_an_unreachable_engine_leaves_nothing_that_blocks_running_again_with_the_same_save(tmp_path):
    from slime.cli import check_run_dir

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "w3 w9"}) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    config = _config(tmp_path, prompts, rollout_external_engine_addrs=(dead,), startup_timeout_s=0.3)
    with pytest.raises(EngineError, match=dead):
        await run_training(config, reward_fn=lambda s: 0.0, progress=False)
    run = tmp_path / "run"
    assert not (run / "metrics.jsonl").exists() and not (run / "trained_groups.jsonl").exists()
    check_run_dir(config)  # before the fix: "--save=... already holds a run"
