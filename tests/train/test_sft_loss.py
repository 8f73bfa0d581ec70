"""SFT loss: the masked NLL, by hand; the trainer's SFT step; token-budget micro-batches; the lr schedule."""

from __future__ import annotations

import math
import random

import pytest
import torch

from slime.config import MegatronConfig, TrainConfig
from slime.data.sft import SFTExample, to_group
from slime.train import objective
from slime.train.batch import build_train_batch, pack_by_token_budget
from slime.train.losses import sft_loss
from slime.train.lr_schedule import lr_at
from slime.train.torch_backend import TorchTrainer

# (ids, mask): prompt tokens 0, assistant tokens 1; the second row has a masked-out middle turn
ROWS = [
    ([5, 9, 2, 17, 8, 41, 3], [0, 0, 0, 1, 1, 1, 1]),
    ([5, 7, 30, 31, 6, 6, 32, 33], [0, 0, 1, 1, 0, 0, 1, 1]),
    ([4, 40, 41], [0, 1, 1]),
]


def _groups(rows=ROWS):
    return [
        to_group(SFTExample(index=i, input_ids=ids, loss_mask=mask), group_id=i, policy_version=0)
        for i, (ids, mask) in enumerate(rows)
    ]


def _config(**kw):
    base = dict(
        lr=1e-2, global_batch_size=3, micro_batch_size=3, num_threads=1, loss_type="sft_loss", loss_agg="token_mean"
    )
    return TrainConfig(**{**base, **kw})


def _hand_nll(model, rows=ROWS) -> tuple[float, list[float]]:
    """Sum over rows of -log p(token | prefix) at every masked token, one row at a time (no padding)."""
    total, per_row = 0.0, []
    with torch.no_grad():
        for ids, mask in rows:
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # [T, V]
            logp = torch.log_softmax(logits, dim=-1)
            nll = [-float(logp[t - 1, ids[t]]) for t in range(1, len(ids)) if mask[t]]
            per_row.append(sum(nll) / len(nll))
            total += sum(nll)
    return total, per_row


def test_sft_loss_is_the_masked_nll_by_hand():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, -9.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, metrics = sft_loss(logprobs, mask, loss_agg="token_mean")
    assert float(loss) == pytest.approx((2.0 + 3.0 + 0.5) / 3)
    assert metrics == {"nll": pytest.approx(5.5 / 3), "num_tokens": 3.0}
    seq, _ = sft_loss(logprobs, mask, loss_agg="seq_mean")
    assert float(seq) == pytest.approx(((2.0 + 3.0) / 2 + 0.5) / 2)
    with pytest.raises(ValueError, match="shape"):
        sft_loss(logprobs, mask[:, :2])


def test_shared_objective_routes_sft_loss_without_old_logprobs():
    batch = build_train_batch(_groups(), pad_token_id=0, current_version=0)
    logprobs = -torch.rand(batch.loss_mask.shape)
    loss, metrics = objective.micro_batch_loss(
        _config(), batch, logprobs, torch.zeros_like(logprobs), float(batch.num_train_tokens)
    )
    assert float(loss) == pytest.approx(float((-logprobs * batch.loss_mask).sum() / batch.num_train_tokens))
    assert set(metrics) == {"nll", "num_tokens"}
    assert not objective.needs_reference(_config(use_kl_loss=True)) and not objective.needs_critic(
        _config(advantage_estimator="ppo")
    )


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_trainer_step_loss_equals_hand_computed_masked_nll(tiny_model_dir, loss_agg):
    trainer = TorchTrainer(_config(loss_agg=loss_agg, micro_batch_size=1), model_dir=tiny_model_dir, seed=0)
    total, per_row = _hand_nll(trainer.model)
    num_tokens = sum(sum(m[1:]) for _, m in ROWS)
    before = {k: v.clone() for k, v in trainer.state_dict_for_sync().items()}
    m = trainer.train_step(_groups()).to_dict()
    expected = total / num_tokens if loss_agg == "token_mean" else sum(per_row) / len(per_row)
    assert m["loss"] == pytest.approx(expected, rel=1e-5)
    assert m["nll"] == pytest.approx(total / num_tokens, rel=1e-5)
    assert m["num_train_tokens"] == num_tokens and m["num_optimizer_steps"] == 1 and m["lr"] == 1e-2
    assert "pg_clipfrac" not in m and "reward_mean" not in m
    assert any(not torch.equal(before[k], v) for k, v in trainer.state_dict_for_sync().items())
    # training on the same rows lowers their NLL
    assert _hand_nll(trainer.model)[0] < total


def test_eval_loss_is_the_token_mean_nll_and_does_not_train(tiny_model_dir):
    trainer = TorchTrainer(_config(loss_agg="seq_mean"), model_dir=tiny_model_dir, seed=0)
    total, _ = _hand_nll(trainer.model)
    before = {k: v.clone() for k, v in trainer.state_dict_for_sync().items()}
    out = trainer.eval_loss(_groups())
    assert (
        out["eval_loss"] == pytest.approx(total / 10, rel=1e-5)
        and out["eval_tokens"] == 10.0
        and out["eval_samples"] == 3.0
    )
    assert all(torch.equal(before[k], v) for k, v in trainer.state_dict_for_sync().items())


def test_token_budget_micro_batches_give_the_same_loss_and_update(tiny_model_dir):
    fixed = TorchTrainer(_config(micro_batch_size=3), model_dir=tiny_model_dir, seed=0)
    packed = TorchTrainer(
        _config(megatron=MegatronConfig(use_dynamic_batch_size=True, max_tokens_per_gpu=9)),
        model_dir=tiny_model_dir,
        seed=0,
    )
    assert [len(mb) for mb in packed._plan([7, 8, 3])[0]] == [1, 1, 1]  # 2 x 8 > 9: every row alone
    grads = []
    for trainer in (fixed, packed):  # record the accumulated gradient right before the optimizer step
        step = trainer._clip_and_step
        trainer._clip_and_step = lambda module, opt, step=step: (
            grads.append({n: p.grad.clone() for n, p in module.named_parameters()}) or step(module, opt)
        )
    a, b = fixed.train_step(_groups()).to_dict(), packed.train_step(_groups()).to_dict()
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("seed", range(20))
def test_packing_respects_the_token_budget_and_loses_no_row(seed):
    rng = random.Random(seed)
    lens = [rng.randint(1, 60) for _ in range(rng.randint(0, 40))]
    budget = rng.randint(1, 200)
    bins = pack_by_token_budget(lens, budget)
    assert sorted(i for b in bins for i in b) == list(range(len(lens)))
    for b in bins:
        assert b == sorted(b) and b
        assert len(b) * max(lens[i] for i in b) <= budget or len(b) == 1  # only a lone over-long row may exceed it


def test_packing_example_from_the_docstring():
    assert pack_by_token_budget([10, 40, 12, 38, 9], 80) == [[1, 3], [0, 2, 4]]
    with pytest.raises(ValueError, match="max_tokens"):
        pack_by_token_budget([1], 0)


def test_lr_schedule_is_the_warm_start_loops_warmup_then_cosine():
    cfg = TrainConfig(
        lr=3e-3, megatron=MegatronConfig(min_lr=3e-4, lr_warmup_iters=50, lr_decay_iters=1200, lr_decay_style="cosine")
    )

    # the hand-written loop that made the shipped warm starts (scripts/make_warmstart.py before it ran slime train)
    def make_warmstart_lr(step: int) -> float:
        if step < 50:
            return 3e-3 * (step + 1) / 50
        return 3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 50) / 1150)))

    for step in (0, 1, 49, 50, 51, 600, 1199):
        assert lr_at(cfg, step) == pytest.approx(make_warmstart_lr(step), rel=1e-12)
    assert lr_at(cfg, 5000) == pytest.approx(3e-4)
    assert lr_at(TrainConfig(lr=1e-3), 10**6) == 1e-3
    with pytest.raises(ValueError, match="--lr-decay-iters"):
        lr_at(TrainConfig(megatron=MegatronConfig(lr_decay_style="linear")), 0)


def test_trainer_follows_the_schedule_step_by_step(tiny_model_dir):
    cfg = _config(
        lr=1e-2, megatron=MegatronConfig(min_lr=0.0, lr_warmup_iters=2, lr_decay_iters=4, lr_decay_style="linear")
    )
    trainer = TorchTrainer(cfg, model_dir=tiny_model_dir, seed=0)
    lrs = [trainer.train_step(_groups()).to_dict()["lr"] for _ in range(5)]
    assert lrs == pytest.approx([5e-3, 1e-2, 1e-2, 5e-3, 0.0])
    assert trainer.num_optimizer_steps == 5
