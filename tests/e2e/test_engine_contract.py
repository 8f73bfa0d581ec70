"""Our client and generate path against the embedded engine over real HTTP (loopback)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from slime.config import RolloutConfig
from slime.engines.pool import HttpEnginePool
from slime.errors import EngineRequestError, EngineUnavailable
from slime.rollout.generate import generate
from slime.servers.embedded import EngineServer
from slime.train.logprobs import sample_logprobs
from slime.types import Sample, Status
from tests.fixtures.tiny_model import perturb_weights, write_tiny_llama

torch.set_num_threads(1)
PROMPT = [0, 5, 9, 17, 3]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("e2e") / "tiny", seed=0)


@pytest.fixture(scope="module")
def model_v2_dir(model_dir, tmp_path_factory):
    return perturb_weights(model_dir, tmp_path_factory.mktemp("e2e") / "tiny-v2", seed=1)


@pytest.fixture
async def pool(model_dir):
    async with EngineServer(model_dir, port=0, seed=0, weight_version="0") as server:
        async with HttpEnginePool(
            [server.url], config=RolloutConfig(request_timeout_s=30, max_retries=1, retry_backoff_s=0.01)
        ) as p:
            yield p


async def test_generate_returns_aligned_tokens_logprobs_and_version(pool):
    r = await pool.generate(PROMPT, {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True}, rid="t1-")
    assert len(r.output_ids) == len(r.output_logprobs) == r.completion_tokens == 12
    assert r.finish_reason.type == "length" and r.weight_version == "0"
    assert r.token_weight_versions == ["0"] * 12
    assert all(lp <= 0 for lp in r.output_logprobs)


async def test_abort_mid_generation_returns_partial_tokens_and_logprobs(pool):
    task = asyncio.create_task(pool.generate(PROMPT, {"max_new_tokens": 240, "ignore_eos": True}, rid="long-"))
    while not task.done():
        await asyncio.sleep(0.02)
        await pool.abort_all()
    r = task.result()
    assert r.finish_reason.type == "abort"
    assert 0 <= len(r.output_ids) < 240 and len(r.output_ids) == len(r.output_logprobs)


async def test_weight_reload_changes_outputs_and_version(pool, model_v2_dir):
    greedy = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    before = await pool.generate(PROMPT, greedy, rid="w0-")
    await pool.update_weights_from_disk(str(model_v2_dir), weight_version="1")
    after = await pool.generate(PROMPT, greedy, rid="w1-")
    assert after.weight_version == "1" and before.weight_version == "0"
    assert after.output_ids != before.output_ids
    info = await pool.clients[0].model_info()
    assert info["weight_version"] == "1" and info["model_path"] == str(model_v2_dir)


async def test_bad_weight_path_is_an_engine_error_naming_the_engine(pool, tmp_path):
    with pytest.raises(EngineRequestError) as info:
        await pool.update_weights_from_disk(str(tmp_path / "missing"), weight_version="9")
    assert pool.urls[0] in str(info.value)


async def test_resume_after_abort_is_token_exact(pool):
    """Greedy: abort after some tokens, resume with prompt + partial; equals the uninterrupted run."""
    ref = Sample(prompt_ids=list(PROMPT))
    await generate(ref, {"temperature": 0.0, "ignore_eos": True}, pool=pool, max_response_len=200, engine_version=0)
    s = Sample(prompt_ids=list(PROMPT))
    task = asyncio.create_task(
        generate(s, {"temperature": 0.0, "ignore_eos": True}, pool=pool, max_response_len=200, engine_version=0)
    )
    while not task.done():
        await asyncio.sleep(0.01)
        await pool.abort_all()
    assert s.status is Status.PARTIAL and len(s.response_ids) < 200
    cut = len(s.response_ids)
    await generate(s, {"temperature": 0.0, "ignore_eos": True}, pool=pool, max_response_len=200, engine_version=0)
    assert s.status is Status.TRUNCATED and s.num_resumes == 1
    assert s.response_ids == ref.response_ids
    assert max(abs(a - b) for a, b in zip(s.rollout_logprobs, ref.rollout_logprobs)) <= 1e-4
    assert s.rollout_logprobs[:cut] == s.rollout_logprobs[:cut]  # old tokens untouched
    s.check_aligned()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_trainer_logprobs_equal_engine_logprobs_on_same_weights(pool, model_dir, temperature):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    r = await pool.generate(
        PROMPT, {"max_new_tokens": 40, "temperature": temperature, "ignore_eos": True}, rid=f"p{temperature}-"
    )
    ours = sample_logprobs(model, PROMPT, r.output_ids, temperature)
    assert max(abs(a - b) for a, b in zip(ours, r.output_logprobs)) <= 1e-4


async def test_unreachable_engine_fails_clearly_after_bounded_retries():
    config = RolloutConfig(request_timeout_s=2, max_retries=2, retry_backoff_s=0.01)
    async with HttpEnginePool(["http://127.0.0.1:9"], config=config) as pool:
        with pytest.raises(EngineUnavailable) as info:
            async with asyncio.timeout(10):
                await pool.generate(PROMPT, {"max_new_tokens": 4}, rid="x-")
    assert "127.0.0.1:9" in str(info.value) and "3" in str(info.value)
