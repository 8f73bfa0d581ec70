"""The torch backend's device and precision: ``--train-device`` and ``--bf16`` (bf16 autocast, fp32 weights).

The CPU tests pin what a CPU machine does (the default stays fp32 on the CPU, SDPA attention, sync
weights fp32 on the CPU) and run the autocast path on the CPU. The ``gpu`` tests (deselected in CI;
``scripts/gpu/torch_backend_gpu.sh`` runs them) check the GPU trainer against the CPU fp32 one:
fp32 on the GPU matches to 1e-4, bf16 autocast to ``BF16_MEAN_TOL`` / ``BF16_MAX_TOL`` nats, and
sync, ``save_hf`` and the loop checkpoint give the same weights and state as on the CPU.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from slime.cli.args import build_parser, config_from_args
from slime.config import MegatronConfig, TrainConfig
from slime.errors import ConfigError
from slime.train.batch import build_train_batch
from slime.train.torch_backend import TorchTrainer
from slime.train.torch_device import resolve_device
from slime.types import Group, Sample, Status

BF16_MEAN_TOL = 1e-2
"""Mean |logprob(GPU, bf16 autocast) - logprob(CPU, fp32)| over response tokens, nats (the megatron parity check's bound)."""
BF16_MAX_TOL = 6e-2
"""Max of the same difference over response tokens, nats."""


def _groups(seed: int = 0, num_samples: int = 8) -> list[Group]:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(num_samples):
        s = Sample(
            prompt_ids=torch.randint(1, 64, (5,), generator=g).tolist(),
            index=i,
            reward=float(i % 2),
            status=Status.COMPLETED,
        )
        n = 4 + i % 5
        s.append(torch.randint(1, 64, (n,), generator=g).tolist(), [-1.0] * n, policy_version=0)
        samples.append(s)
    return [Group(group_id=0, samples=samples)]


FACTS = dict(rollout_temperature=0.8, seed=0)
"""What the run hands a trainer from outside its section (``Config.trainer_kwargs``)."""


def _config(device: str = "auto", bf16: bool = False, **kw) -> TrainConfig:
    base = dict(lr=3e-3, global_batch_size=8, micro_batch_size=4, num_threads=1, use_tis=True)
    return TrainConfig(**{**base, **kw}, device=device, megatron=MegatronConfig(bf16=bf16))


def _old_logprobs(trainer: TorchTrainer, groups) -> tuple[torch.Tensor, torch.Tensor]:
    """(old logprobs [B, L] on the CPU, loss mask [B, L]) as the trainer computes them before an update."""
    batch = build_train_batch(groups, pad_token_id=0, current_version=trainer.policy_version)
    mbs = [mb for step in trainer._plan(batch.seq_lens.tolist()) for mb in step]
    filled = trainer._before_update(batch.to(trainer.device), mbs)
    return filled.old_logprobs.cpu(), batch.loss_mask


# --- CPU -------------------------------------------------------------------------------------


def test_auto_is_the_cpu_without_cuda_and_cuda_is_refused_there(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="--train-device cuda"):
        resolve_device("cuda")


def test_auto_and_cuda_pick_the_current_cuda_device_when_torch_sees_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")


def test_default_on_a_cpu_machine_is_fp32_on_the_cpu_with_sdpa(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trainer = TorchTrainer(_config(), model_dir=tiny_model_dir, **FACTS)
    assert trainer.device == torch.device("cpu") and not trainer.bf16
    assert {(p.device.type, p.dtype) for p in trainer.model.parameters()} == {("cpu", torch.float32)}
    assert trainer.model.config._attn_implementation == "sdpa"
    state = trainer.state_dict_for_sync()
    assert {(t.device.type, t.dtype) for t in state.values()} == {("cpu", torch.float32)}
    params = {p.data_ptr() for p in trainer.model.parameters()}
    assert not params & {t.data_ptr() for t in state.values()}  # copies: training cannot tear them


def test_bf16_autocast_trains_on_the_cpu_with_fp32_weights_and_an_on_policy_first_step(tiny_model_dir):
    groups = _groups()
    fp32, bf16 = (
        TorchTrainer(_config("cpu"), model_dir=tiny_model_dir, **FACTS),
        TorchTrainer(_config("cpu", bf16=True), model_dir=tiny_model_dir, **FACTS),
    )
    ref, mask = _old_logprobs(fp32, groups)
    got, _ = _old_logprobs(bf16, groups)
    diff = ((got - ref).abs() * mask).sum() / mask.sum()
    assert 0 < diff < BF16_MEAN_TOL  # autocast ran (bf16 rounding shows) and stays close
    metrics = bf16.train_step(groups).to_dict()
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and metrics["approx_kl"] == pytest.approx(
        0.0, abs=1e-7
    )
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}
    assert all(s["exp_avg"].dtype == torch.float32 for s in bf16.optimizer.state.values())


def test_cpu_is_refused_with_the_megatron_backend():
    args = build_parser().parse_args(["--train-backend", "megatron", "--train-device", "cpu"])
    with pytest.raises(ConfigError, match="--train-device"):
        config_from_args(args)


# --- GPU ---------------------------------------------------------------------------------------

gpu = pytest.mark.gpu


@gpu
def test_gpu_fp32_matches_the_cpu_and_keeps_everything_on_the_device(tiny_model_dir):
    groups = _groups()
    cpu, cuda = (
        TorchTrainer(_config("cpu"), model_dir=tiny_model_dir, **FACTS),
        TorchTrainer(_config("cuda"), model_dir=tiny_model_dir, **FACTS),
    )
    assert {p.device.type for p in cuda.model.parameters()} == {"cuda"}
    ref, mask = _old_logprobs(cpu, groups)
    got, _ = _old_logprobs(cuda, groups)
    assert ((got - ref).abs() * mask).max() < 1e-4
    m_cpu, m_cuda = cpu.train_step(groups).to_dict(), cuda.train_step(groups).to_dict()
    for key in ("loss", "grad_norm", "ratio_mean", "tis_mean", "num_train_tokens"):
        assert m_cuda[key] == pytest.approx(m_cpu[key], rel=1e-3, abs=1e-5), key
    assert all(s["exp_avg"].device.type == "cuda" for s in cuda.optimizer.state.values())


@gpu
def test_gpu_bf16_logprobs_match_the_cpu_fp32_reference_before_and_after_a_step(tiny_model_dir):
    groups = _groups()
    cpu, cuda = (
        TorchTrainer(_config("cpu"), model_dir=tiny_model_dir, **FACTS),
        TorchTrainer(_config("cuda", bf16=True), model_dir=tiny_model_dir, **FACTS),
    )
    for _ in range(2):
        ref, mask = _old_logprobs(cpu, groups)
        got, _ = _old_logprobs(cuda, groups)
        diff = (got - ref).abs() * mask
        assert diff.sum() / mask.sum() < BF16_MEAN_TOL and diff.max() < BF16_MAX_TOL
        m_cpu, m_cuda = cpu.train_step(groups).to_dict(), cuda.train_step(groups).to_dict()
        assert m_cuda["loss"] == pytest.approx(m_cpu["loss"], abs=2e-2)
        assert m_cuda["ratio_mean"] == pytest.approx(
            1.0, abs=1e-6
        )  # old logprobs and step 1 agree exactly on the GPU too


@gpu
def test_gpu_sync_save_hf_and_loop_checkpoint_round_trip(tiny_model_dir, tmp_path):
    from slime.loop.checkpoint import LoopState, load_checkpoint, save_checkpoint

    groups = _groups()
    trainer = TorchTrainer(_config("cuda", bf16=True), model_dir=tiny_model_dir, **FACTS)
    trainer.train_step(groups)
    state = trainer.state_dict_for_sync()
    assert {(t.device.type, t.dtype) for t in state.values()} == {("cpu", torch.float32)}
    live = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    assert all(torch.equal(state[k], live[k]) for k in state if k in live)
    saved = load_file(f"{trainer.save_hf(str(tmp_path / 'hf'))}/model.safetensors")
    assert saved.keys() <= state.keys() and all(
        saved[k].dtype == torch.float32 and torch.equal(saved[k], state[k]) for k in saved
    )

    loop = LoopState(
        step=1,
        policy_version=1,
        source={},
        next_group_id=1,
        num_admitted=1,
        rollout_id=1,
        taken=[],
        ready=[],
        partial=[],
    )
    ckpt = save_checkpoint(tmp_path / "ckpt", loop, trainer=trainer)
    resumed = TorchTrainer(_config("cuda", bf16=True), model_dir=str(ckpt / "model"), **FACTS)
    load_checkpoint(ckpt, trainer=resumed)
    assert (
        resumed.policy_version == trainer.policy_version and resumed.num_optimizer_steps == trainer.num_optimizer_steps
    )
    assert all(s["exp_avg"].device.type == "cuda" for s in resumed.optimizer.state.values())
    a, b = trainer.train_step(groups).to_dict(), resumed.train_step(groups).to_dict()
    for key in ("loss", "grad_norm", "lr"):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
