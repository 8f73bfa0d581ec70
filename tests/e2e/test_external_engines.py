"""External engines (``--rollout-external-engine-addrs``) get the run's initial weights at start.

The "external" engine is the embedded engine served in this process (``EngineServer``), started on
*other* weights, as a server left over from an earlier run would be.
"""

from __future__ import annotations

import json

import pytest

from slime.config import Config, DataConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import ConfigError, first_slime_error
from slime.loop.driver import run_training
from slime.servers.embedded import EngineServer
from tests.e2e.test_record_replay import parity
from tests.fixtures.tiny_model import write_tiny_llama


def _config(tmp_path, model, url):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(16)) + "\n")
    return Config(
        data=DataConfig(prompt_data=str(prompts)),
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=8, request_timeout_s=60),
        loop=LoopConfig(mode="sync", rollout_batch_size=2, num_rollout=1),
        train=TrainConfig(lr=1e-3, global_batch_size=4, micro_batch_size=4),
        engine=EngineConfig(hf_checkpoint=str(model), rollout_external_engine_addrs=(url,), health_check_interval_s=0),
        run_dir=str(tmp_path / "run"),
    )


async def test_a_fresh_run_loads_its_initial_weights_into_an_engine_that_served_other_weights(tmp_path):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    earlier = write_tiny_llama(tmp_path / "earlier-run-final", seed=1, with_tokenizer=True)  # same shape, other weights
    async with EngineServer(earlier, port=0, seed=0, weight_version="0") as server:  # versions alone cannot tell
        await run_training(_config(tmp_path, model, server.url), reward_fn=parity, progress=False)
        assert server.model_path != str(earlier)
    (step,) = [
        r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"
    ]
    # the tokens were sampled from the trainer's weights (with the earlier weights the gap is ~1 nat)
    assert step["train/train_rollout_logprob_abs_diff"] < 1e-3 and step["max_version_lag"] == 0


async def test_an_engine_serving_another_model_is_refused_at_start_naming_both(tmp_path):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    other = write_tiny_llama(tmp_path / "other", seed=0, hidden_size=48, with_tokenizer=True)
    async with EngineServer(other, port=0, seed=0, weight_version="0") as server:
        with pytest.raises(
            BaseExceptionGroup
        ) as info:  # raised inside start_rollout's task group; `slime train` prints the leaf
            await run_training(_config(tmp_path, model, server.url), reward_fn=parity, progress=False)
        assert server.model_path == str(other)  # nothing was loaded
    error = first_slime_error(info.value)
    assert isinstance(error, ConfigError)
    message = str(error)
    assert (
        str(other) in message
        and str(model) in message
        and "hidden_size 48 (engine) vs 32 (run)" in message
        and "\n" not in message
    )
