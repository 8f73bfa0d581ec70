"""slime/servers/embedded/sampling.py: the logprob convention and the per-request sampler."""

from __future__ import annotations

import math

import pytest
import torch

from slime.servers.embedded.sampling import SamplingParams, sample_next, seeded_generator, token_logprobs


def test_token_logprobs_is_log_softmax_of_temperature_scaled_logits():
    got = token_logprobs(torch.tensor([2.0, 1.0, 0.0]), torch.tensor(1), 0.5)
    expected = 2.0 - math.log(math.exp(4.0) + math.exp(2.0) + 1.0)
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_greedy_temperature_uses_the_unscaled_distribution():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(5)
    assert torch.equal(token_logprobs(logits, ids, 0.0), token_logprobs(logits, ids, 1.0))


def test_per_row_temperatures_match_scalar_temperatures():
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([0, 3, 6])
    temps = [0.0, 0.7, 1.3]
    rows = token_logprobs(logits, ids, torch.tensor(temps))
    for i, t in enumerate(temps):
        assert rows[i].item() == pytest.approx(token_logprobs(logits[i], ids[i], t).item(), abs=1e-7)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.0, top_p=1e-4),
        SamplingParams(temperature=1.0, min_p=1.0),
    ],
)
def test_degenerate_truncation_picks_the_argmax(params):
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(2))
    gens = [seeded_generator(0, str(i)) for i in range(4)]
    ids, lps = sample_next(logits, [params] * 4, gens)
    assert torch.equal(ids, logits.argmax(-1))
    assert torch.allclose(lps, token_logprobs(logits, ids, params.temperature))


def test_top_k_keeps_only_the_k_most_likely_tokens():
    logits = torch.randn(1, 16, generator=torch.Generator().manual_seed(3))
    top2 = set(logits[0].topk(2).indices.tolist())
    gen = seeded_generator(0, "k")
    seen = {int(sample_next(logits, [SamplingParams(top_k=2)], [gen])[0]) for _ in range(200)}
    assert seen == top2


def test_a_row_samples_the_same_token_alone_or_in_a_batch():
    logits = torch.randn(6, 32, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(temperature=0.9, top_p=0.9), SamplingParams(temperature=0.0)] * 3
    batch_ids, batch_lps = sample_next(logits, params, [seeded_generator(7, f"r{i}") for i in range(6)])
    for i in range(6):
        ids, lps = sample_next(logits[i : i + 1], [params[i]], [seeded_generator(7, f"r{i}")])
        assert ids.item() == batch_ids[i].item() and lps.item() == pytest.approx(batch_lps[i].item(), abs=1e-7)


def test_seeded_generator_depends_on_seed_and_key_only():
    draw = lambda s, k: torch.rand(3, generator=seeded_generator(s, k)).tolist()  # noqa: E731
    assert draw(1, "a") == draw(1, "a")
    assert draw(1, "a") != draw(2, "a") and draw(1, "a") != draw(1, "b")


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.5), SamplingParams(temperature=0.5, top_k=3)])
def test_sampling_frequencies_follow_the_scaled_distribution(params):
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5]])
    probs = torch.softmax(logits[0] / 0.5, dim=-1)[:3]
    probs = probs / probs.sum() if params.top_k == 3 else torch.softmax(logits[0] / 0.5, dim=-1)
    gen = seeded_generator(0, "freq")
    counts = torch.zeros(4)
    for _ in range(3000):
        counts[sample_next(logits, [params], [gen])[0]] += 1
    assert torch.allclose(counts[: len(probs)] / 3000, probs, atol=0.03)
