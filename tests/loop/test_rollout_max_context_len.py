"""THUDM/slime's --rollout-max-context-len: prompt + response tokens of a rollout sample stay within it."""

from __future__ import annotations

import json

import pytest

from slime.cli.args import build_parser, config_from_args
from slime.config import Config, DataConfig, DebugConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import ConfigError, DataError
from slime.loop import assemble
from slime.loop.driver import run_training
from tests.fixtures.fake_pool import run_on_a_recording_fake_pool
from tests.fixtures.tiny_model import write_tiny_llama


def test_the_response_cap_is_what_the_context_leaves():
    r = config_from_args(
        build_parser().parse_args(["--rollout-max-context-len", "10", "--rollout-max-response-len", "8"])
    ).rollout
    assert (r.response_cap(1), r.response_cap(4), r.response_cap(10)) == (8, 6, 0)
    assert RolloutConfig(rollout_max_response_len=8).response_cap(1000) == 8  # unset: the response cap alone
    with pytest.raises(ConfigError, match=r"^--rollout-max-context-len=1 is invalid"):
        config_from_args(build_parser().parse_args(["--rollout-max-context-len", "1"]))


def _run(tmp_path, monkeypatch, prompts, ctx):
    seen = run_on_a_recording_fake_pool(monkeypatch, assemble)

    async def reward(sample):
        return 1.0

    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "label": "x"}) + "\n" for p in prompts))
    config = Config(
        data=DataConfig(prompt_data=str(path)),
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=8, rollout_max_context_len=ctx),
        loop=LoopConfig(rollout_batch_size=1, over_sampling_batch_size=1, num_rollout=1),
        train=TrainConfig(global_batch_size=2, micro_batch_size=2),
        engine=EngineConfig(hf_checkpoint=str(model)),
        debug=DebugConfig(debug_rollout_only=True),
        run_dir=str(tmp_path / "run"),
    )
    return path, seen, run_training(config, reward_fn=reward, progress=False)


async def test_rollout_requests_ask_for_what_the_context_leaves(tmp_path, monkeypatch):
    _, seen, run = _run(tmp_path, monkeypatch, ["w5 w6"], ctx=5)
    await run
    assert seen and all(n + p["max_new_tokens"] == 5 for n, p in seen)  # the prompt's tokens + the response cap


async def test_a_prompt_that_fills_the_context_is_a_bad_row_at_load(tmp_path, monkeypatch):
    path, _, run = _run(tmp_path, monkeypatch, ["w5", "w5 w6 w7 w8 w9 w5 w6 w7"], ctx=5)
    with pytest.raises(
        DataError,
        match=rf"^{path}:2: the prompt renders to \d+ tokens, the rollout context of 5 \(--rollout-max-context-len\)",
    ):
        await run
