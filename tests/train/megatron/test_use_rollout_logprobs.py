"""``--use-rollout-logprobs`` (THUDM/slime's flag): the engine's logprobs are the PPO ratio's old policy and the
policy's old-logprob forward pass is skipped, in both backends alike."""

from __future__ import annotations

import pytest
import torch

from slime.cli.args import build_parser, config_from_args
from slime.config import MegatronConfig, TrainConfig
from slime.errors import ConfigError
from tests.train.megatron.test_megatron_trainer import _groups

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")


def _config(global_batch_size: int = 4) -> TrainConfig:
    return TrainConfig(
        lr=1e-3,
        global_batch_size=global_batch_size,
        micro_batch_size=2,
        use_rollout_logprobs=True,
        megatron=MegatronConfig(),
    )


def test_both_backends_take_the_engines_logprobs_as_old_and_skip_the_policy_forward(
    hf_dirs, megatron_cpu, cpu_megatron_trainer, monkeypatch
):
    from slime.train import torch_forward
    from slime.train.torch_backend import TorchTrainer

    groups = _groups(96)
    torch_trainer = TorchTrainer(_config(), model_dir=hf_dirs["qwen2"], rollout_temperature=0.9)
    megatron = cpu_megatron_trainer(_config(), hf_dirs["qwen2"], megatron_cpu, rollout_temperature=0.9)
    policy_calls = []
    real_compute = torch_forward.compute_token_logprobs
    monkeypatch.setattr(
        torch_forward,
        "compute_token_logprobs",
        lambda model, *a, **k: (policy_calls.append(model), real_compute(model, *a, **k))[1],
    )
    real_forward = type(megatron.step)._forward
    monkeypatch.setattr(
        type(megatron.step),
        "_forward",
        lambda self, model, mb, **k: (policy_calls.append(model), real_forward(self, model, mb, **k))[1],
    )
    seen_old = []
    real_before = type(megatron.step).before_update
    monkeypatch.setattr(
        type(megatron.step),
        "before_update",
        lambda self, b, s: (lambda r: (seen_old.append((r.old_logprobs, r.rollout_logprobs)), r)[1])(
            real_before(self, b, s)
        ),
    )

    got, want = megatron.train_step(groups).to_dict(), torch_trainer.train_step(groups).to_dict()

    assert not [m for m in policy_calls if m is torch_trainer.model or m is megatron.model]  # no old-logprob forward
    old, rollout = seen_old[0]
    assert torch.equal(old, rollout)
    for metrics in (got, want):
        assert "train_rollout_logprob_abs_diff" not in metrics and "train_rollout_logprob_abs_diff_max" not in metrics
        assert (
            abs(metrics["ratio_mean"] - 1.0) > 1e-3
        )  # pi_theta / pi_rollout: the rollout logprobs here are not the model's
    for key in ("loss", "grad_norm", "ratio_mean", "pg_clipfrac", "approx_kl", "num_train_tokens"):
        assert got[key] == pytest.approx(want[key], rel=2e-4, abs=2e-6), key


def test_without_the_flag_the_old_policy_is_recomputed_and_the_mismatch_reported(hf_dirs):
    from slime.train.torch_backend import TorchTrainer

    config = TrainConfig(lr=1e-3, global_batch_size=8, micro_batch_size=2)  # one optimizer step: ratio 1 exactly
    metrics = (
        TorchTrainer(config, model_dir=hf_dirs["qwen2"], rollout_temperature=0.9).train_step(_groups(96)).to_dict()
    )
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and metrics["train_rollout_logprob_abs_diff"] > 0
    bypass = (
        TorchTrainer(_config(global_batch_size=8), model_dir=hf_dirs["qwen2"], rollout_temperature=0.9)
        .train_step(_groups(96))
        .to_dict()
    )
    assert abs(bypass["ratio_mean"] - 1.0) > 1e-3


def test_the_flag_reaches_the_config_and_refuses_corrections_whose_weight_would_be_one():
    def parse(*argv):
        return config_from_args(
            build_parser().parse_args(["--rollout-batch-size", "8", "--global-batch-size", "8", *argv])
        )

    assert parse("--use-rollout-logprobs").train.use_rollout_logprobs is True
    for extra in (["--use-tis"], ["--mis-level", "token"], ["--use-decoupled-ppo"]):
        with pytest.raises(ConfigError, match=r"^--use-rollout-logprobs makes the engine's logprobs the old policy"):
            parse("--use-rollout-logprobs", *extra)
