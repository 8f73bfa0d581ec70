"""On-policy distillation on the train side (slime/train/opd.py, objective.with_advantages, batch layout),
checked against numbers worked out by hand, plus a tiny trainer that must close the gap to its teacher."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from slime.config import TrainConfig
from slime.train import objective
from slime.train.batch import build_train_batch
from slime.train.logprobs import sample_logprobs
from slime.train.opd import reverse_kl
from slime.train.torch_backend import TorchTrainer
from slime.types import Group, Sample, Status

# Two samples of one prompt [1, 5] (P = 2). Sample 0: response [7, 8, 2], all trained, reward 1.
# Sample 1: response [9, 2], the second token not trained (a tool token), reward 0.
# T = 5, L = 4; sample 0 predicts its response at t = 1..3, sample 1 at t = 1..2.
OLD = [[0.0, -0.1, -2.0, -0.5], [0.0, -1.0, -0.2, 0.0]]
TEACHER = [[-0.3, -0.5, -0.5], [-0.4, -3.0]]
# kl_t = old - teacher on trained tokens: s0 [0.2, -1.5, 0.0], s1 [-0.6, (masked) 0]


def _close(t: torch.Tensor, want, atol: float = 1e-6) -> None:
    torch.testing.assert_close(t, torch.tensor(want, dtype=t.dtype), atol=atol, rtol=0)


def _groups():
    s0 = Sample(prompt_ids=[1, 5], index=0, reward=1.0, status=Status.COMPLETED)
    s0.append([7, 8, 2], [-0.1, -2.0, -0.5], policy_version=0)
    s1 = Sample(prompt_ids=[1, 5], index=1, reward=0.0, status=Status.COMPLETED)
    s1.append([9], [-1.0], policy_version=0)
    s1.append([2], [-0.2], policy_version=0, trainable=False)
    s0.set_teacher_logprobs(TEACHER[0])
    s1.set_teacher_logprobs(TEACHER[1])
    return [Group(group_id=0, samples=[s0, s1])]


def _batch(estimator="grpo"):
    batch = build_train_batch(
        _groups(),
        pad_token_id=0,
        current_version=0,
        normalize_advantages_by_std=False,
        advantage_estimator=estimator,
        use_opd=True,
    )
    return dataclasses.replace(batch, old_logprobs=torch.tensor(OLD))


def test_teacher_logprobs_are_laid_out_on_the_response_positions():
    batch = _batch()
    _close(batch.teacher_logprobs, [[0.0, -0.3, -0.5, -0.5], [0.0, -0.4, -3.0, 0.0]])
    assert batch.loss_mask.tolist() == [[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]]


def test_reverse_kl_is_student_minus_teacher_on_trained_tokens():
    batch = _batch()
    kl = reverse_kl(batch.old_logprobs, batch.teacher_logprobs, batch.loss_mask)
    _close(kl, [[0.0, 0.2, -1.5, 0.0], [0.0, -0.6, 0.0, 0.0]])
    # trainer-side metric: (0.2 - 1.5 + 0.0 - 0.6) / 4 trained tokens
    assert objective.opd_metrics(batch)["opd_reverse_kl"] == pytest.approx(-0.475, abs=1e-6)


def test_grpo_advantage_minus_coef_times_kl():
    # Dr. GRPO scores: rewards [1, 0] -> [0.5, -0.5]; coef 0.5 -> penalty s0 [0.1, -0.75, 0], s1 [-0.3, 0]
    cfg = TrainConfig(use_opd=True, opd_kl_coef=0.5, disable_grpo_std_normalization=True)
    out = objective.with_advantages(cfg, _batch())
    _close(out.advantages, [[0.0, 0.4, 1.25, 0.5], [0.0, -0.2, -0.5, 0.0]])


def test_opd_only_advantage_is_minus_kl_and_rewards_still_show():
    # --opd-only: the estimator sees reward 0 for every sample, so only -coef * kl is left
    batch = build_train_batch(_groups(), pad_token_id=0, current_version=0, use_opd=True, use_task_reward=False)
    assert batch.rewards.tolist() == [1.0, 0.0] and batch.sample_advantages.tolist() == [0.0, 0.0]
    batch = dataclasses.replace(batch, old_logprobs=torch.tensor(OLD))
    out = objective.with_advantages(TrainConfig(use_opd=True, opd_only=True, opd_kl_coef=2.0), batch)
    _close(out.advantages, [[0.0, -0.4, 3.0, 0.0], [0.0, 1.2, 0.0, 0.0]])


def test_reinforce_plus_plus_adds_the_term_before_whitening():
    # returns (gamma 1, reward at the last trained token): s0 [1, 1, 1], s1 [0, 0]; minus kl (coef 1) on
    # trained tokens: [0.8, 2.5, 1.0] and [0.6]; whitened over those 4: mean 1.225, unbiased var
    # (0.180625 + 1.625625 + 0.050625 + 0.390625) / 3 = 0.7491666...
    cfg = TrainConfig(use_opd=True, opd_kl_coef=1.0, advantage_estimator="reinforce_plus_plus")
    out = objective.with_advantages(cfg, _batch("reinforce_plus_plus"))
    std = math.sqrt(2.2475 / 3 + 1e-8)
    want = [(x - 1.225) / std for x in (0.8, 2.5, 1.0, 0.6)]
    got = out.advantages[out.loss_mask > 0].tolist()
    assert got == pytest.approx(want, abs=1e-5)


def test_without_opd_grpo_advantages_are_untouched():
    batch = _batch()
    out = objective.with_advantages(TrainConfig(disable_grpo_std_normalization=True), batch)
    assert out is batch and objective.opd_metrics(dataclasses.replace(batch, teacher_logprobs=None)) == {}


def test_a_finished_sample_without_teacher_logprobs_is_refused_and_a_failed_one_is_skipped():
    groups = _groups()
    groups[0].samples[1].teacher_logprobs = None
    with pytest.raises(ValueError, match=r"index=1.*no teacher_logprobs"):
        build_train_batch(groups, pad_token_id=0, current_version=0, use_opd=True)
    groups[0].samples[1].status = Status.FAILED  # e.g. the teacher call failed: never trained
    batch = build_train_batch(groups, pad_token_id=0, current_version=0, use_opd=True)
    assert batch.num_samples == len(groups[0].samples) - 1  # the failed sample gets no row


def test_pure_opd_steps_bring_the_student_towards_its_teacher(tiny_model_dir, tmp_path):
    """The sign is right: training on ``-kl_t`` alone moves each token's logprob towards the teacher's."""
    from transformers import AutoModelForCausalLM

    from tests.fixtures.tiny_model import write_tiny_llama

    teacher = AutoModelForCausalLM.from_pretrained(
        write_tiny_llama(tmp_path / "teacher", seed=3), dtype=torch.float32
    ).eval()
    prompt, responses = [5, 9, 2], [[17, 8, 41, 3], [30, 31, 32, 33], [40, 41, 42], [50, 51]]
    cfg = TrainConfig(
        lr=3e-3, global_batch_size=4, micro_batch_size=4, num_threads=1, use_opd=True, opd_only=True, opd_kl_coef=1.0
    )
    trainer = TorchTrainer(cfg, model_dir=tiny_model_dir, rollout_temperature=1.0, seed=0)
    teacher_lps = [sample_logprobs(teacher, prompt, resp, 1.0) for resp in responses]

    def gap() -> float:  # mean squared per-token logprob gap, student vs teacher
        diffs = [
            a - b
            for resp, t in zip(responses, teacher_lps)
            for a, b in zip(sample_logprobs(trainer.model, prompt, resp, 1.0), t)
        ]
        return sum(d * d for d in diffs) / len(diffs)

    def groups():
        samples = []
        for i, (resp, t) in enumerate(zip(responses, teacher_lps)):
            s = Sample(
                prompt_ids=list(prompt), index=i, reward=float(i == 0), status=Status.COMPLETED
            )  # --opd-only: not trained on
            s.append(resp, sample_logprobs(trainer.model, prompt, resp, 1.0), policy_version=trainer.policy_version)
            s.set_teacher_logprobs(t)
            samples.append(s)
        return [Group(group_id=0, samples=samples)]

    before = gap()
    for _ in range(8):
        metrics = trainer.train_step(groups()).to_dict()
        assert math.isfinite(metrics["opd_reverse_kl"])
    assert gap() < 0.7 * before, (before, gap())
