"""Evaluation with several samples per prompt: mean accuracy over samples and unbiased pass@k."""

from __future__ import annotations

import math

import pytest

from slime.data.dataset import PromptRow
from slime.loop.evaluate import evaluate, evaluate_datasets, pass_at_k
from tests.fixtures.fake_pool import FakePool


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 1, 2) == 0.5 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)


async def test_n_samples_per_eval_prompt_reports_accuracy_and_pass_at_k():
    seen = []

    async def reward(sample):  # prompt "a": only sample 0 is right; prompt "b": samples 0 and 2
        seen.append((sample.prompt, sample.index))
        return 1.0 if (sample.prompt, sample.index) in {("a", 0), ("b", 0), ("b", 2)} else 0.0

    rows = [PromptRow(index=0, prompt="a", label="x"), PromptRow(index=1, prompt="b", label="y")]
    out = await evaluate(
        rows,
        pool=FakePool(),
        tokenize=lambda t: [1, 3 + ord(t)],
        decode=lambda ids: "",
        reward_fn=reward,
        max_response_len=8,
        engine_version=0,
        reward_timeout_s=5,
        temperature=1.0,
        n_samples_per_prompt=4,
    )
    assert sorted(seen) == [(p, j) for p in "ab" for j in range(4)]
    assert out["accuracy"] == 3 / 8
    assert out["pass@1"] == pytest.approx((0.25 + 0.5) / 2)
    assert out["pass@2"] == pytest.approx((0.5 + (1 - 1 / 6)) / 2)
    assert out["pass@4"] == 1.0 and set(k for k in out if k.startswith("pass@")) == {"pass@1", "pass@2", "pass@4"}


async def test_eval_samples_at_the_given_top_p_and_response_cap():
    seen = []

    class Pool(FakePool):
        async def generate(self, input_ids, sampling_params, **kw):
            seen.append(dict(sampling_params))
            return await super().generate(input_ids, sampling_params, **kw)

    async def reward(sample):
        return 0.0

    rows = [PromptRow(index=0, prompt="a", label="x")]
    await evaluate(
        rows,
        pool=Pool(),
        tokenize=lambda t: [1, 3 + ord(t)],
        decode=lambda ids: "",
        reward_fn=reward,
        max_response_len=3,
        engine_version=0,
        reward_timeout_s=5,
        temperature=0.6,
        top_p=0.7,
    )
    assert seen and all(p["top_p"] == 0.7 and p["temperature"] == 0.6 and p["max_new_tokens"] <= 3 for p in seen)


async def test_named_eval_datasets_are_reported_per_name_beside_the_pooled_accuracy():
    async def reward(sample):  # dataset "easy": every sample right; "hard": none
        return 1.0 if sample.prompt.startswith("e") else 0.0

    easy = [PromptRow(index=i, prompt=f"e{i}", label="x") for i in range(3)]
    hard = [PromptRow(index=0, prompt="h0", label="x")]
    kw = dict(
        pool=FakePool(),
        tokenize=lambda t: [1, 3 + len(t)],
        decode=lambda ids: "",
        reward_fn=reward,
        max_response_len=4,
        engine_version=0,
        reward_timeout_s=5,
        temperature=1.0,
        n_samples_per_prompt=2,
    )
    out = await evaluate_datasets({"easy": easy, "hard": hard}, **kw)
    assert out["eval/easy/accuracy"] == 1.0 and out["eval/hard/accuracy"] == 0.0
    assert out["eval/easy/pass@2"] == 1.0 and out["eval/hard/failed"] == 0.0
    assert out["accuracy"] == 6 / 8 and out["failed"] == 0.0  # over every sample of both
    unnamed = await evaluate_datasets({None: hard}, **kw)
    assert set(unnamed) == {
        "accuracy",
        "pass@1",
        "pass@2",
        "mean_response_len",
        "failed",
        "engine_failures",
    }  # the keys of one unnamed path
    assert math.isnan((await evaluate_datasets({}, **kw))["accuracy"])
