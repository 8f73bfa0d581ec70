"""Packing an optimizer step over data-parallel ranks and micro-batches, and unpacking per-token values."""

from __future__ import annotations

import pytest
import torch

from slime.train.batch import TrainBatch

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")
from slime.train.megatron.packing import pack_samples, plan_step, select_samples  # noqa: E402


def _batch(lens: list[int]) -> TrainBatch:
    b, t = len(lens), max(lens)
    ids = torch.zeros(b, t, dtype=torch.long)
    for i, n in enumerate(lens):
        ids[i, :n] = torch.arange(1, n + 1) + 100 * i
    z = torch.arange(b * (t - 1), dtype=torch.float32).reshape(b, t - 1)
    return TrainBatch(
        input_ids=ids,
        attention_mask=(torch.arange(t) < torch.tensor(lens)[:, None]).long(),
        loss_mask=z,
        rollout_logprobs=z,
        advantages=z,
        staleness=z.long(),
        sample_advantages=torch.zeros(b),
        rewards=torch.zeros(b),
        seq_lens=torch.tensor(lens),
        response_mask=z,
    )


def test_plan_balances_tokens_over_dp_ranks_and_packs_by_token_budget():
    lens = [900, 300, 700, 100, 500, 600]  # the module docstring's example
    plan = plan_step(lens, dp_size=2, micro_batch_size=1, max_tokens_per_gpu=1200)
    assert plan == [[[0, 3], [4]], [[1, 2], [5]]]
    assert all(sum(lens[i] for i in mb) <= 1200 for rank in plan for mb in rank)


def test_plan_by_sample_count_keeps_index_order_and_uses_every_sample_once():
    plan = plan_step([5, 4, 3, 2, 1], dp_size=2, micro_batch_size=2, max_tokens_per_gpu=None)
    assert plan == [[[0, 3], [4]], [[1, 2]]]
    assert sorted(i for rank in plan for mb in rank for i in mb) == [0, 1, 2, 3, 4]


def test_a_sample_over_the_token_budget_gets_its_own_micro_batch():
    assert plan_step([50, 10, 10], dp_size=1, micro_batch_size=1, max_tokens_per_gpu=30) == [[[0], [1, 2]]]


def test_pack_restarts_positions_per_sample_and_pads_to_a_multiple():
    batch = _batch([4, 2, 3])
    mb = pack_samples(batch, [2, 0], pad_token_id=0, pad_to=4, head_dim=4, rope_theta=10000.0)
    assert mb.input_ids.tolist() == [[201, 202, 203, 1, 2, 3, 4, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
    assert mb.params.seq_bounds == (0, 3, 7, 8) and mb.params.cu_seqlens_q.tolist() == [0, 3, 7, 8]
    assert mb.params.pad_tokens == 1  # the last segment is the padding (the dense attention path skips it)
    assert pack_samples(batch, [2, 1], pad_token_id=0, pad_to=5, head_dim=4, rope_theta=10000.0).params.pad_tokens == 0
    assert mb.labels[0, :6].tolist() == [202, 203, 1, 2, 3, 4]
    cos, sin = mb.params.rope_cos, mb.params.rope_sin
    assert cos.shape == (8, 1, 4) and torch.equal(cos[3], cos[0]) and torch.equal(sin[0], torch.zeros(1, 4))


def test_unpack_puts_each_prediction_at_its_train_batch_position():
    batch = _batch([4, 2, 3])
    mb = pack_samples(batch, [2, 0], pad_token_id=0, pad_to=1, head_dim=4, rope_theta=10000.0)
    packed = torch.arange(mb.num_tokens, dtype=torch.float32) + 1  # value at packed position i = i + 1
    dense = mb.unpack(packed)
    assert dense.tolist() == [[1.0, 2.0, 0.0], [4.0, 5.0, 6.0]]  # sample 2 (3 tokens) then sample 0 (4 tokens)
    sub = select_samples(batch, mb.samples)
    assert sub.loss_mask.shape == dense.shape and torch.equal(sub.input_ids[0, :3], batch.input_ids[2, :3])


def test_empty_placeholder_has_no_predictions():
    mb = pack_samples(_batch([3]), [], pad_token_id=7, pad_to=4, head_dim=4, rope_theta=10000.0)
    assert mb.input_ids.tolist() == [[7, 7, 7, 7]] and mb.flat.numel() == 0 and mb.params.pad_tokens == 4


def test_cp_split_gives_each_rank_an_early_and_a_late_chunk_of_every_sequence():
    """megatron's load-balanced causal split per sequence (2 x CP chunks); full_index undoes it."""
    from slime.train.megatron.context_parallel import cp_split

    bounds = (0, 8, 12)  # segments of 8 and 4 tokens, CP=2: chunks of 2 and 1
    local0, full_index, lb = cp_split(bounds, 2, 0)
    local1, _, _ = cp_split(bounds, 2, 1)
    assert local0.tolist() == [0, 1, 6, 7, 8, 11] and local1.tolist() == [2, 3, 4, 5, 9, 10]
    assert lb == (0, 4, 6)
    assert torch.equal(torch.cat([local0, local1])[full_index], torch.arange(12))
