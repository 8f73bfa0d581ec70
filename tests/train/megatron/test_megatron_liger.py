"""``--logprob-impl liger``: logprobs, entropies, losses and gradients equal the default path's.

liger-kernel's fused linear + scaled cross entropy runs here on the CPU (its chunked PyTorch path;
the SM90 CuTe DSL kernel is checked on the GPU by scripts/gpu/bench_trainer.py --logprob-impl).
The tests that call liger skip when liger-kernel cannot be imported: it is in the ``test`` extra on
Linux, but its package imports triton at import time, and triton has no wheel for every platform.
The refusals are tested without it (liger hidden from the import system).
"""

from __future__ import annotations

import sys

import pytest
import torch

from slime.config import MegatronConfig, TrainConfig

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")
from slime.train.megatron.logprobs import fused_linear_logprobs, vocab_parallel_logprobs  # noqa: E402

try:
    import liger_kernel.ops.fused_linear_scaled_cross_entropy  # noqa: F401

    HAVE_LIGER = True
except ImportError:  # absent, or triton absent (liger_kernel's package imports it)
    HAVE_LIGER = False
needs_liger = pytest.mark.skipif(
    not HAVE_LIGER, reason="liger-kernel (slime[liger]; it imports triton) is not importable here"
)


@needs_liger
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_fused_linear_logprobs_equal_the_logits_path_values_and_grads(temperature):
    torch.manual_seed(0)
    hidden = torch.randn(7, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(12, 16, dtype=torch.float64, requires_grad=True)  # 10 real rows + 2 padding
    target = torch.tensor([0, 3, 9, 9, 1, 5, 2])
    lp, ent = fused_linear_logprobs(hidden, weight, target, temperature=temperature, vocab_size=10, entropy_grad=True)
    ref_lp, ref_ent = vocab_parallel_logprobs(
        hidden @ weight.T, target, temperature=temperature, vocab_size=10, entropy_grad=True
    )
    assert lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)  # both compute in fp32
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)  # both compute in fp32
    w_lp, w_ent = torch.randn(7), torch.randn(7)
    grads = torch.autograd.grad((lp * w_lp + ent * w_ent).sum(), (hidden, weight))
    ref_grads = torch.autograd.grad((ref_lp * w_lp + ref_ent * w_ent).sum(), (hidden, weight))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)  # both compute in fp32
    assert torch.equal(
        grads[1][10:], torch.zeros(2, 16, dtype=torch.float64)
    )  # padding rows: never sampled, no gradient


@needs_liger
def test_entropy_is_differentiable_only_with_entropy_grad():
    hidden, weight = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    target = torch.tensor([1, 2, 4])
    _, ent0 = fused_linear_logprobs(hidden, weight, target, temperature=1.0, vocab_size=5)
    lp1, ent1 = fused_linear_logprobs(hidden, weight, target, temperature=1.0, vocab_size=5, entropy_grad=True)
    assert not ent0.requires_grad and ent1.requires_grad and lp1.requires_grad


def _groups(vocab: int):
    from test_megatron_trainer import _groups as trainer_groups

    return trainer_groups(vocab, seed=7)


@needs_liger
@pytest.mark.parametrize("family", ["qwen2", "llama"])  # tied and untied output weight
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_train_step_with_liger_equals_the_default_path(
    family, temperature, hf_dirs, megatron_cpu, cpu_megatron_trainer
):
    """Same weights and groups, packed micro-batches (token budget): the step's metrics (loss, entropy,
    ratio from the old-logprob pass, grad norm), every parameter's gradient and the updated weights agree."""
    from slime.train.megatron.model import output_weight

    def trainer(impl: str):
        mcfg = MegatronConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=24, logprob_impl=impl)
        config = TrainConfig(lr=1e-3, global_batch_size=4, loss_agg="token_mean", entropy_coef=0.01, megatron=mcfg)
        return cpu_megatron_trainer(config, hf_dirs[family], megatron_cpu, rollout_temperature=temperature)

    slime_t, liger_t = trainer("slime"), trainer("liger")
    mb = next(mb for _, _, mbs in slime_t._plan(_batch(slime_t)) for mb in mbs if len(mb.samples) > 1)
    assert mb.num_tokens > 0  # at least one micro-batch packs several samples
    out = liger_t.model(
        input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
    )
    assert out.shape[-1] == liger_t.arch.hidden_size  # the liger path's model returns hidden states, not logits
    if family == "qwen2":
        assert output_weight(liger_t.ddp) is liger_t.model.embedding.word_embeddings.weight
    groups = _groups(96)
    for _ in range(2):
        got, want = liger_t.train_step(groups).to_dict(), slime_t.train_step(groups).to_dict()
        for key in (
            "loss",
            "grad_norm",
            "entropy",
            "ratio_mean",
            "approx_kl",
            "pg_clipfrac",
            "train_rollout_logprob_abs_diff",
        ):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
        grads = {n: p.grad for n, p in liger_t.model.named_parameters()}
        for name, p in slime_t.model.named_parameters():
            torch.testing.assert_close(
                grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
            )
    params = dict(liger_t.model.named_parameters())
    for name, p in slime_t.model.named_parameters():
        torch.testing.assert_close(params[name], p, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def _batch(trainer):
    from slime.train.batch import build_train_batch

    return build_train_batch(_groups(96), pad_token_id=0, current_version=0)


def test_liger_is_refused_with_an_install_hint_when_absent(monkeypatch):
    from slime.train.megatron.trainer import MegatronTrainer

    for name in [n for n in sys.modules if n == "liger_kernel" or n.startswith("liger_kernel.")] + ["liger_kernel"]:
        monkeypatch.setitem(sys.modules, name, None)  # what an uninstalled package looks like to import
    config = TrainConfig(megatron=MegatronConfig(logprob_impl="liger"))
    with pytest.raises(ImportError, match=r"--logprob-impl liger needs liger-kernel: pip install 'slime\[liger\]'"):
        MegatronTrainer(config, model_dir="/nonexistent")
    hidden = torch.randn(2, 4)
    with pytest.raises(ImportError, match="liger-kernel"):
        fused_linear_logprobs(hidden, torch.randn(3, 4), torch.tensor([0, 1]), temperature=1.0, vocab_size=3)


def test_liger_under_tensor_parallelism_is_refused():
    from slime.train.megatron.trainer import MegatronTrainer

    config = TrainConfig(megatron=MegatronConfig(logprob_impl="liger", tensor_model_parallel_size=2))
    with pytest.raises(ValueError, match="--logprob-impl liger runs at --tensor-model-parallel-size 1 only"):
        MegatronTrainer(config, model_dir="/nonexistent")
