"""Issue 30: a sample whose every token is masked (over-stale) is in no loss denominator, so it does not
scale the other samples' weight down (``slime.train.losses.loss_denominator``)."""

from __future__ import annotations

import pytest
import torch

from slime.config import TrainConfig
from slime.train.batch import build_train_batch
from slime.train.losses import aggregate, loss_denominator
from slime.train.torch_backend import TorchTrainer
from slime.types import Group, Sample, Status

PROMPT = [5, 9, 2]
RESPONSES = [[17, 8, 41, 3], [30, 31, 32, 33], [40, 41, 42], [50, 51]]


def _groups(masked: int) -> list[Group]:
    samples = []
    for i, (resp, r) in enumerate(zip(RESPONSES, (1.0, 0.0, 0.0, 0.0))):
        s = Sample(prompt_ids=list(PROMPT), index=i, reward=r, status=Status.COMPLETED)
        s.append(resp, [-1.0] * len(resp), policy_version=0)
        if i == masked:
            s.loss_mask = [0] * len(resp)  # as the staleness mask leaves a sample whose tokens are all over-stale
        samples.append(s)
    return [Group(group_id=0, samples=samples)]


def test_the_denominator_counts_the_samples_with_a_trained_token():
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert loss_denominator(mask, "seq_mean") == 2.0 and loss_denominator(mask, "token_mean") == 3.0
    x = torch.tensor([[2.0, 4.0], [9.0, 9.0], [6.0, 9.0]])
    assert float(aggregate(x, mask, loss_agg="seq_mean")) == pytest.approx((3.0 + 6.0) / 2)


def test_a_fully_masked_sample_is_out_of_the_trainers_seq_mean(tiny_model_dir):
    # one optimizer step on-policy (ratio 1): loss = -sum of the trained samples' advantages / their number (3)
    config = TrainConfig(lr=3e-3, global_batch_size=4, micro_batch_size=2, num_threads=1)
    trainer = TorchTrainer(config, model_dir=tiny_model_dir, rollout_temperature=0.8, seed=0)
    groups = _groups(masked=3)
    adv = build_train_batch(groups, pad_token_id=0, current_version=0).sample_advantages  # [4]
    m = trainer.train_step(groups).to_dict()
    assert m["num_train_tokens"] == 4 + 4 + 3
    assert m["loss"] == pytest.approx(-float(adv[:3].sum()) / 3, abs=1e-6)
