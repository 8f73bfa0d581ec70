import pytest
import torch

from slime.train.logprobs import compute_token_logprobs, compute_token_logprobs_and_entropy, sample_logprobs

SEQS = [[5, 9, 2, 33, 17, 8, 41, 3, 60], [7, 1, 22, 4, 10], [12, 13, 14]]


def _padded(seqs, pad=63):
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), t), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)], mask[b, : len(s)] = torch.tensor(s), 1
    return ids, mask


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_padded_batch_equals_each_sequence_alone(tiny_model, temperature):
    ids, mask = _padded(SEQS)
    with torch.no_grad():
        batched = compute_token_logprobs(tiny_model, ids, mask, temperature=temperature)  # [3, 8]
        for b, s in enumerate(SEQS):
            alone = compute_token_logprobs(
                tiny_model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long), temperature=temperature
            )
            torch.testing.assert_close(batched[b, : len(s) - 1], alone[0], atol=1e-6, rtol=0)
            assert torch.equal(batched[b, len(s) - 1 :], torch.zeros(ids.shape[1] - len(s)))


@pytest.mark.parametrize(("temperature", "divisor"), [(0.7, 0.7), (1e-7, 1.0)])
def test_logprobs_are_log_softmax_of_temperature_scaled_logits(tiny_model, temperature, divisor):
    ids = torch.tensor([SEQS[0]])
    with torch.no_grad():
        logits = tiny_model(input_ids=ids).logits[0, :-1]  # [T-1, V]
        want = torch.log_softmax(logits / divisor, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        got = compute_token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=temperature)[0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_sample_logprobs_returns_one_logprob_per_response_token(tiny_model):
    prompt, response = SEQS[0][:4], SEQS[0][4:]
    got = sample_logprobs(tiny_model, prompt, response, 0.7)
    ids = torch.tensor([SEQS[0]])
    with torch.no_grad():
        full = compute_token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=0.7)[0]
    assert len(got) == len(response)
    torch.testing.assert_close(torch.tensor(got), full[3:], atol=0, rtol=0)


def test_entropy_matches_the_scaled_distribution_and_logprobs_match(tiny_model):
    ids, mask = _padded(SEQS[:2])
    with torch.no_grad():
        logprobs, entropy = compute_token_logprobs_and_entropy(tiny_model, ids, mask, temperature=0.7)
        assert torch.equal(logprobs, compute_token_logprobs(tiny_model, ids, mask, temperature=0.7))
        logp = torch.log_softmax(tiny_model(input_ids=ids[:1]).logits[0, :-1] / 0.7, dim=-1)
    torch.testing.assert_close(entropy[0], -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=0)
    assert torch.equal(entropy[1, 4:], torch.zeros(4))


def test_sample_logprobs_needs_a_prompt(tiny_model):
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        sample_logprobs(tiny_model, [], [1, 2], 1.0)
