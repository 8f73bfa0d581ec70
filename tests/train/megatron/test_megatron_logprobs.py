"""Logprobs from megatron's (vocab-parallel) logits equal the torch backend's, values and gradients."""

from __future__ import annotations

import pytest
import torch

from slime.config import MegatronConfig, TrainConfig
from slime.train import objective
from slime.train.batch import build_train_batch
from slime.train.logprobs import compute_token_logprobs_and_entropy

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")
from slime.train.megatron.logprobs import vocab_parallel_logprobs  # noqa: E402
from slime.types import Group, Sample, Status


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprob_and_entropy_match_log_softmax_with_padded_vocab(temperature):
    torch.manual_seed(0)
    logits = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)  # 10 real tokens + 2 padding rows
    target = torch.tensor([0, 3, 9, 9, 1])
    lp, ent = vocab_parallel_logprobs(logits, target, temperature=temperature, vocab_size=10)
    scaled = logits[:, :10] / (temperature if temperature > 1e-6 else 1.0)
    ref = torch.log_softmax(scaled, -1)
    torch.testing.assert_close(lp, ref.gather(-1, target[:, None])[:, 0].float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, -(ref.exp() * ref).sum(-1).float(), rtol=0, atol=1e-6)
    w = torch.randn(5)
    (lp * w).sum().backward()
    got = logits.grad.clone()
    logits.grad = None
    (ref.gather(-1, target[:, None])[:, 0] * w.double()).sum().backward()
    torch.testing.assert_close(got, logits.grad, rtol=0, atol=1e-6)
    assert torch.equal(got[:, 10:], torch.zeros(5, 2, dtype=torch.float64))


def test_entropy_grad_path_gives_the_same_values_and_a_differentiable_entropy():
    torch.manual_seed(1)
    logits = torch.randn(4, 8, requires_grad=True)
    target = torch.tensor([1, 2, 3, 4])
    lp0, ent0 = vocab_parallel_logprobs(logits, target, temperature=0.8, vocab_size=7)
    lp1, ent1 = vocab_parallel_logprobs(logits, target, temperature=0.8, vocab_size=7, entropy_grad=True)
    torch.testing.assert_close(lp0, lp1)
    torch.testing.assert_close(ent0, ent1)
    assert not ent0.requires_grad and ent1.requires_grad


def _groups(vocab: int) -> list[Group]:
    g = torch.Generator().manual_seed(3)
    samples = []
    for i, (p, r) in enumerate([(3, 4), (5, 2), (2, 6), (4, 3)]):
        s = Sample(
            prompt_ids=torch.randint(1, vocab, (p,), generator=g).tolist(),
            index=i,
            reward=float(i % 2),
            status=Status.COMPLETED,
        )
        s.append(torch.randint(1, vocab, (r,), generator=g).tolist(), [-1.0] * r, policy_version=0)
        samples.append(s)
    return [Group(group_id=0, samples=samples)]


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_packed_megatron_loss_and_grads_match_the_torch_backend(family, hf_dirs, megatron_cpu, make_hf):
    """Same weights, same samples: GRPO loss from packed megatron logprobs == the torch backend's, and so are
    the embedding gradients (through the custom logprob backward, the unpacking and the model)."""
    from slime.train.megatron.arch import ModelArch, load_hf_config
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config
    from slime.train.megatron.packing import pack_samples, select_samples

    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs[family]))
    model = build_gpt_model(arch, transformer_config(arch, MegatronConfig(), use_cpu_initialization=True), tp_size=1)
    load_hf_weights(model, HFCheckpointReader(hf_dirs[family]), arch, tp_size=1, tp_rank=0)
    hf = make_hf(family)
    cfg = TrainConfig(entropy_coef=0.01)
    batch = build_train_batch(_groups(arch.vocab_size), pad_token_id=0, current_version=0)
    with torch.no_grad():
        old, _ = compute_token_logprobs_and_entropy(hf, batch.input_ids, batch.attention_mask, temperature=0.8)
    batch = objective.with_advantages(cfg, type(batch)(**{**batch.__dict__, "old_logprobs": old - 0.05}))

    order = [3, 0, 2, 1]
    mb = pack_samples(batch, order, pad_token_id=0, pad_to=1, head_dim=arch.head_dim, rope_theta=arch.rope_theta)
    logits = model(
        input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
    )
    lp, ent = vocab_parallel_logprobs(
        logits[0], mb.labels[0], temperature=0.8, vocab_size=arch.vocab_size, entropy_grad=True
    )
    loss_m, metrics_m = objective.micro_batch_loss(
        cfg, select_samples(batch, order), mb.unpack(lp), mb.unpack(ent), 4.0
    )
    loss_m.backward()

    lp_h, ent_h = compute_token_logprobs_and_entropy(
        hf, batch.input_ids, batch.attention_mask, temperature=0.8, entropy_grad=True
    )
    loss_h, metrics_h = objective.micro_batch_loss(cfg, batch, lp_h, ent_h, 4.0)
    loss_h.backward()

    torch.testing.assert_close(loss_m, loss_h, rtol=1e-5, atol=1e-6)
    assert metrics_m["num_tokens"] == metrics_h["num_tokens"]
    torch.testing.assert_close(metrics_m["entropy"], metrics_h["entropy"], rtol=1e-5, atol=1e-6)
    g_m = model.embedding.word_embeddings.weight.grad[: arch.vocab_size]
    torch.testing.assert_close(g_m, hf.model.embed_tokens.weight.grad, rtol=1e-4, atol=1e-6)
