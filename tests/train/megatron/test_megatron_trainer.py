"""MegatronTrainer's step logic on the CPU against TorchTrainer: same weights, groups and config, same metrics.

megatron-core's DDP and optimizer allocate on CUDA, so this test swaps in the two things a CPU
lacks, in a test subclass (conftest's ``cpu_megatron_trainer``): a pass-through DDP (``no_sync`` /
``zero_grad_buffer``) and torch's AdamW with ``clip_grad_norm_`` as the optimizer step (what
TorchTrainer does). Everything else
is the trainer's own code: planning and packing, old logprobs on the training micro-batches,
advantages, the loss, the denominators and the metrics. The GPU run (scripts/gpu/megatron_checks.sh)
covers megatron's DDP and optimizer.
"""

from __future__ import annotations

import pytest
import torch

from slime.config import MegatronConfig, TrainConfig
from slime.types import Group, Sample, Status

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")


def _groups(vocab: int, seed: int = 11) -> list[Group]:
    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi in range(2):
        samples = []
        for i in range(4):
            s = Sample(
                prompt_ids=torch.randint(1, vocab, (3 + i,), generator=g).tolist(),
                index=i,
                group_id=gi,
                reward=float((i + gi) % 3 == 0),
                status=Status.COMPLETED,
            )
            r = 2 + (i * 3 + gi) % 5
            s.append(
                torch.randint(1, vocab, (r,), generator=g).tolist(),
                (-torch.rand(r, generator=g)).tolist(),
                policy_version=0,
            )
            samples.append(s)
        groups.append(Group(group_id=gi, samples=samples))
    return groups


@pytest.mark.parametrize("dynamic", [False, True])
def test_train_step_metrics_match_the_torch_backend(dynamic, hf_dirs, megatron_cpu, cpu_megatron_trainer):
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(
        lr=1e-3,
        global_batch_size=4,
        micro_batch_size=2,
        loss_agg="token_mean" if dynamic else "seq_mean",
        megatron=MegatronConfig(use_dynamic_batch_size=dynamic, max_tokens_per_gpu=20),
    )
    groups = _groups(96)
    megatron = cpu_megatron_trainer(config, hf_dirs["qwen2"], megatron_cpu, rollout_temperature=0.9)
    reference = TorchTrainer(config, model_dir=hf_dirs["qwen2"], rollout_temperature=0.9)
    for _ in range(2):
        got, want = megatron.train_step(groups).to_dict(), reference.train_step(groups).to_dict()
        for key in (
            "loss",
            "grad_norm",
            "ratio_mean",
            "entropy",
            "pg_clipfrac",
            "approx_kl",
            "train_rollout_logprob_abs_diff",
            "num_train_tokens",
            "num_optimizer_steps",
        ):
            assert got[key] == pytest.approx(want[key], rel=2e-4, abs=2e-6), key
    assert got["policy_version"] == 2.0


@pytest.mark.parametrize("dynamic", [False, True])
def test_sft_loss_step_matches_the_torch_backend(dynamic, hf_dirs, megatron_cpu, cpu_megatron_trainer):
    """``--loss-type sft_loss`` goes through the shared loss path (objective.micro_batch_loss) in both backends."""
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(
        lr=1e-3,
        global_batch_size=4,
        micro_batch_size=2,
        loss_type="sft_loss",
        loss_agg="token_mean",
        megatron=MegatronConfig(use_dynamic_batch_size=dynamic, max_tokens_per_gpu=20),
    )
    groups = _groups(96)
    megatron = cpu_megatron_trainer(config, hf_dirs["qwen2"], megatron_cpu)
    reference = TorchTrainer(config, model_dir=hf_dirs["qwen2"])
    for _ in range(2):
        got, want = megatron.train_step(groups).to_dict(), reference.train_step(groups).to_dict()
        for key in ("loss", "nll", "grad_norm", "num_train_tokens", "num_optimizer_steps"):
            assert got[key] == pytest.approx(want[key], rel=2e-4, abs=2e-6), key
        assert "pg_clipfrac" not in got and "reward_mean" not in got


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_plus_plus"])
def test_opd_step_matches_the_torch_backend(estimator, hf_dirs, megatron_cpu, cpu_megatron_trainer):
    """``--use-opd``: the reverse-KL advantage term (objective.with_advantages) is the same in both backends."""
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(
        lr=1e-3, global_batch_size=4, micro_batch_size=2, advantage_estimator=estimator, use_opd=True, opd_kl_coef=0.5
    )
    groups = _groups(96)
    g = torch.Generator().manual_seed(5)
    for s in (s for grp in groups for s in grp.samples):
        s.set_teacher_logprobs((-3 * torch.rand(len(s.response_ids), generator=g)).tolist())
    megatron = cpu_megatron_trainer(config, hf_dirs["qwen2"], megatron_cpu)
    reference = TorchTrainer(config, model_dir=hf_dirs["qwen2"])
    for _ in range(2):
        got, want = megatron.train_step(groups).to_dict(), reference.train_step(groups).to_dict()
        for key in ("loss", "grad_norm", "opd_reverse_kl", "ratio_mean", "num_train_tokens"):
            assert got[key] == pytest.approx(want[key], rel=2e-4, abs=2e-6), key
    assert got["opd_reverse_kl"] != 0.0


def test_bf16_model_hands_its_logits_over_in_bf16_with_the_same_step(
    hf_dirs, megatron_cpu, cpu_megatron_trainer, monkeypatch
):
    """A ``Float16Module`` stage returns bf16 logits (no fp32 copy of [tokens, vocabulary]); the step's
    loss, metrics and updated weights equal those of the fp32-copy path (the upcast is exact)."""
    from megatron.core.transformer.module import Float16Module

    from slime.train.megatron import step as step_mod

    config = TrainConfig(
        lr=1e-3,
        global_batch_size=4,
        micro_batch_size=2,
        megatron=MegatronConfig(bf16=True, use_dynamic_batch_size=True, max_tokens_per_gpu=20),
    )
    seen: list[torch.dtype] = []
    real = step_mod.vocab_parallel_logprobs
    monkeypatch.setattr(
        step_mod,
        "vocab_parallel_logprobs",
        lambda logits, *a, **k: (seen.append(logits.dtype), real(logits, *a, **k))[1],
    )
    results = []
    for keep_bf16 in (True, False):
        monkeypatch.setattr(step_mod, "float16_wrapped", lambda model, keep=keep_bf16: keep)
        trainer = cpu_megatron_trainer(config, hf_dirs["qwen2"], megatron_cpu, rollout_temperature=0.9)
        trainer.model = Float16Module(trainer.tconfig, trainer.model)
        trainer.ddp = type(trainer.ddp)(trainer.model)
        trainer.step = trainer._new_step(type(trainer.step))  # the step over the wrapped model
        seen.clear()
        metrics = trainer.train_step(_groups(96)).to_dict()
        assert seen and set(seen) == {torch.bfloat16 if keep_bf16 else torch.float32}
        results.append((metrics, [p.detach().clone() for p in trainer.model.parameters()]))
    (m_bf16, w_bf16), (m_fp32, w_fp32) = results
    for key in ("loss", "grad_norm", "entropy", "ratio_mean", "approx_kl"):
        assert m_bf16[key] == pytest.approx(m_fp32[key], rel=1e-6, abs=1e-7), key
    for a, b in zip(w_bf16, w_fp32):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_float16_wrapped_finds_megatrons_wrapper_through_ddp(megatron_cpu, hf_dirs, cpu_megatron_trainer):
    from megatron.core.transformer.module import Float16Module

    from slime.train.megatron.model import float16_wrapped

    trainer = cpu_megatron_trainer(TrainConfig(megatron=MegatronConfig(bf16=True)), hf_dirs["qwen2"], megatron_cpu)
    gpt = trainer.model
    wrapped = Float16Module(trainer.tconfig, gpt)

    class Wrapper(torch.nn.Module):  # DDP's shape: the wrapped model as .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    class Float16Lookalike(torch.nn.Module):  # a same-named class is not megatron's
        pass

    Float16Lookalike.__name__ = "Float16Module"
    assert float16_wrapped(wrapped) and float16_wrapped(Wrapper(wrapped))
    assert not float16_wrapped(gpt) and not float16_wrapped(Wrapper(gpt)) and not float16_wrapped(Float16Lookalike())
