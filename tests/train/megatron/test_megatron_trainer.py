"""MegatronTrainer's step logic on the CPU against TorchTrainer: same weights, groups and config, same metrics.

megatron-core's DDP and optimizer allocate on CUDA, so this test swaps in the two things a CPU
lacks, in a test subclass: a pass-through DDP (``no_sync`` / ``zero_grad_buffer``) and torch's
AdamW with ``clip_grad_norm_`` as the optimizer step (what TorchTrainer does). Everything else
is the trainer's own code: planning and packing, old logprobs on the training micro-batches,
advantages, the loss, the denominators and the metrics. The GPU run (scripts/gpu/megatron_checks.sh)
covers megatron's DDP and optimizer.
"""

from __future__ import annotations

import contextlib
import math
import threading

import pytest
import torch

from slime.config import MegatronConfig, TrainConfig
from slime.types import Group, Sample, Status

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")


class _PassThroughDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        return contextlib.nullcontext()

    def zero_grad_buffer(self):
        self.module.zero_grad(set_to_none=True)


class _ConstantLR:
    def __init__(self, lr: float):
        self.lr = lr

    def get_lr(self, _group):
        return self.lr


def _cpu_trainer(config: TrainConfig, model_dir: str, ctx):
    from slime.train.megatron.arch import ModelArch, load_hf_config
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config
    from slime.train.megatron.parallel import ControlChannel
    from slime.train.megatron.router_metrics import attach_megatron_routers
    from slime.train.megatron.trainer import MegatronTrainer

    class CpuMegatronTrainer(MegatronTrainer):
        def __init__(self):  # MegatronTrainer.__init__ minus CUDA, megatron DDP and optimizer
            self.config, self.model_dir, self.policy_version = config, model_dir, 0
            self._lock = threading.Lock()
            self.arch = ModelArch.from_hf_config(load_hf_config(model_dir))
            self.tconfig = transformer_config(self.arch, config.megatron, use_cpu_initialization=True)
            self.ctx, self.channel = ctx, ControlChannel(ctx)
            self.pad_token_id, self.pad_to = 0, 1
            self.model = build_gpt_model(self.arch, self.tconfig, tp_size=1)
            load_hf_weights(self.model, HFCheckpointReader(model_dir), self.arch, tp_size=1, tp_rank=0)
            self.ddp, self.ref_model = _PassThroughDDP(self.model), None
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=(config.adam_beta1, config.adam_beta2), weight_decay=config.weight_decay)
            self.scheduler = _ConstantLR(config.lr)
            a = self.arch
            self.router_stats = attach_megatron_routers(self.model, num_experts=a.num_experts, topk=a.moe_router_topk, device=torch.device("cpu")) if a.is_moe else None

        def _optimizer_step(self) -> float:
            norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_grad))
            if math.isfinite(norm):
                self.optimizer.step()
            return norm

    return CpuMegatronTrainer()


def _groups(vocab: int) -> list[Group]:
    g = torch.Generator().manual_seed(11)
    groups = []
    for gi in range(2):
        samples = []
        for i in range(4):
            s = Sample(prompt_ids=torch.randint(1, vocab, (3 + i,), generator=g).tolist(), index=i, group_id=gi, reward=float((i + gi) % 3 == 0), status=Status.COMPLETED)
            r = 2 + (i * 3 + gi) % 5
            s.append(torch.randint(1, vocab, (r,), generator=g).tolist(), (-torch.rand(r, generator=g)).tolist(), policy_version=0)
            samples.append(s)
        groups.append(Group(group_id=gi, samples=samples))
    return groups


@pytest.mark.parametrize("dynamic", [False, True])
def test_train_step_metrics_match_the_torch_backend(dynamic, hf_dirs, megatron_cpu):
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(
        lr=1e-3, global_batch_size=4, micro_batch_size=2, rollout_temperature=0.9, loss_agg="token_mean" if dynamic else "seq_mean",
        megatron=MegatronConfig(use_dynamic_batch_size=dynamic, max_tokens_per_gpu=20),
    )
    groups = _groups(96)
    megatron = _cpu_trainer(config, hf_dirs["qwen2"], megatron_cpu)
    reference = TorchTrainer(config, model_dir=hf_dirs["qwen2"])
    for _ in range(2):
        got, want = megatron.train_step(groups), reference.train_step(groups)
        for key in ("loss", "grad_norm", "ratio_mean", "entropy", "pg_clipfrac", "approx_kl", "train_rollout_logprob_abs_diff", "num_train_tokens", "num_optimizer_steps"):
            assert got[key] == pytest.approx(want[key], rel=2e-4, abs=2e-6), key
    assert got["policy_version"] == 2.0


@pytest.mark.parametrize("dynamic", [False, True])
def test_sft_loss_step_matches_the_torch_backend(dynamic, hf_dirs, megatron_cpu):
    """``--loss-type sft_loss`` goes through the shared loss path (objective.micro_batch_loss) in both backends."""
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(
        lr=1e-3, global_batch_size=4, micro_batch_size=2, loss_type="sft_loss", loss_agg="token_mean",
        megatron=MegatronConfig(use_dynamic_batch_size=dynamic, max_tokens_per_gpu=20),
    )
    groups = _groups(96)
    megatron = _cpu_trainer(config, hf_dirs["qwen2"], megatron_cpu)
    reference = TorchTrainer(config, model_dir=hf_dirs["qwen2"])
    for _ in range(2):
        got, want = megatron.train_step(groups), reference.train_step(groups)
        for key in ("loss", "nll", "grad_norm", "num_train_tokens", "num_optimizer_steps"):
            assert got[key] == pytest.approx(want[key], rel=2e-4, abs=2e-6), key
        assert "pg_clipfrac" not in got and "reward_mean" not in got


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_plus_plus"])
def test_opd_step_matches_the_torch_backend(estimator, hf_dirs, megatron_cpu):
    """``--use-opd``: the reverse-KL advantage term (objective.with_advantages) is the same in both backends."""
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(lr=1e-3, global_batch_size=4, micro_batch_size=2, rollout_temperature=1.0, advantage_estimator=estimator,
                         use_opd=True, opd_kl_coef=0.5)
    groups = _groups(96)
    g = torch.Generator().manual_seed(5)
    for s in (s for grp in groups for s in grp.samples):
        s.set_teacher_logprobs((-3 * torch.rand(len(s.response_ids), generator=g)).tolist())
    megatron = _cpu_trainer(config, hf_dirs["qwen2"], megatron_cpu)
    reference = TorchTrainer(config, model_dir=hf_dirs["qwen2"])
    for _ in range(2):
        got, want = megatron.train_step(groups), reference.train_step(groups)
        for key in ("loss", "grad_norm", "opd_reverse_kl", "ratio_mean", "num_train_tokens"):
            assert got[key] == pytest.approx(want[key], rel=2e-4, abs=2e-6), key
    assert got["opd_reverse_kl"] != 0.0
