"""Evaluation with several samples per prompt: mean accuracy over samples and unbiased pass@k."""

from __future__ import annotations

import pytest

from slime.data.dataset import PromptRow
from slime.loop.evaluate import evaluate, pass_at_k
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
    out = await evaluate(rows, pool=FakePool(), tokenize=lambda t: [1, 3 + ord(t)], decode=lambda ids: "", reward_fn=reward,
                         max_response_len=8, engine_version=0, reward_timeout_s=5, temperature=1.0, n_samples_per_prompt=4)
    assert sorted(seen) == [(p, j) for p in "ab" for j in range(4)]
    assert out["accuracy"] == 3 / 8
    assert out["pass@1"] == pytest.approx((0.25 + 0.5) / 2)
    assert out["pass@2"] == pytest.approx((0.5 + (1 - 1 / 6)) / 2)
    assert out["pass@4"] == 1.0 and set(k for k in out if k.startswith("pass@")) == {"pass@1", "pass@2", "pass@4"}
