"""The dense (right-padded) attention path of ``SDPACoreAttention``, on the CPU in float64.

On CUDA a micro-batch whose packed sequences are close in length runs as one padded [b, heads, L, d]
SDPA batch instead of the varlen kernel. It must equal causal attention within each sequence exactly:
outputs and the gradients of query, key and value, with ragged lengths, a padding segment, empty
segments and grouped key/value heads. The per-sequence reference is the path the CPU runs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from slime.train.megatron.dense_attention import attention_layout, dense_attention, dense_index
from slime.train.megatron.layers import PackedRoPEParams, SDPACoreAttention, attention_path_metrics


@pytest.fixture(autouse=True)
def _own_plan_state(monkeypatch):
    """Plans made here count in the process-wide tallies: keep them out of other tests' train steps."""
    monkeypatch.setattr(SDPACoreAttention, "_plans", {"dense": 0, "varlen": 0})
    monkeypatch.setattr(SDPACoreAttention, "_dense_shapes", set())


def _per_sequence(q, k, v, bounds, scale):
    out = torch.zeros_like(q)
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            qs, ks, vs = (x[a:b].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            o = F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=scale, enable_gqa=ks.shape[1] != qs.shape[1]
            )
            out[a:b] = o.squeeze(0).transpose(0, 1)
    return out


def test_the_layout_pads_only_when_the_padded_work_stays_within_the_ratio():  # multiple 1: exact lengths
    assert attention_layout((0, 4096, 8192, 12288, 16384), 1.5) == (4, 4096)  # the bench's micro-batch: no padding
    assert attention_layout((0, 100, 190, 190, 290), 1.5) == (3, 100)  # an empty segment takes no row
    assert attention_layout((0, 4096, 4196, 4296, 4396), 1.5) is None  # one long, three short: 4 x 4096^2 >> sum
    assert attention_layout((0, 4096, 8192), 0) is None  # ratio 0: varlen always
    assert attention_layout((0,), 1.5) is None
    # lengths 2 and 1: padded 2 x 2^2 = 8, unpadded 5; dense from ratio 8 / 5 on
    assert attention_layout((0, 2, 3), 1.59) is None and attention_layout((0, 2, 3), 1.6) == (2, 2)


def test_the_index_maps_each_packed_token_to_its_padded_row():
    assert dense_index((0, 3, 3, 5), 3).tolist() == [0, 1, 2, 3, 4]  # empty segment skipped, second sequence at row 3
    assert dense_index((0, 2, 5, 6), 3).tolist() == [0, 1, 3, 4, 5, 6]
    assert dense_index((0, 4, 8), 4) is None


@pytest.mark.parametrize(
    "bounds,heads,kv_heads",
    [((0, 7, 12, 12, 20, 23), 4, 2), ((0, 6, 12, 18), 4, 4), ((0, 6, 12, 18), 6, 2), ((0, 9), 2, 1)],
    ids=["ragged-empty-gqa", "uniform-mha", "uniform-gqa", "one-sequence"],
)
def test_dense_attention_equals_causal_attention_per_sequence_with_gradients(bounds, heads, kv_heads):
    torch.manual_seed(0)
    t, d, scale = bounds[-1], 8, 0.3
    lens = [b - a for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    layout = (len(lens), max(lens))
    index = dense_index(bounds, layout[1])
    q0 = torch.randn(t, heads, d, dtype=torch.float64)
    k0, v0 = torch.randn(t, kv_heads, d, dtype=torch.float64), torch.randn(t, kv_heads, d, dtype=torch.float64)
    grad = torch.randn(t, heads, d, dtype=torch.float64)
    results = []
    for fn in (
        lambda q, k, v: dense_attention(q, k, v, layout, scale, index),
        lambda q, k, v: _per_sequence(q, k, v, bounds, scale),
    ):
        q, k, v = (x.clone().requires_grad_(True) for x in (q0, k0, v0))
        out = fn(q, k, v)
        out.backward(grad)
        results.append((out.detach(), q.grad, k.grad, v.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert results[0][2].abs().sum() > 0  # the comparison is not of zeros


def test_a_key_value_view_that_is_not_contiguous_is_accepted(monkeypatch):
    """megatron splits q/k/v out of one projection: a ``view`` of such a key would raise (on any device)."""
    t, d = 8, 4
    qkv = torch.randn(t, 3, 2, d, dtype=torch.float64)  # megatron splits one projection: strided views
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    assert not k.is_contiguous()
    seen = []

    def spy(q, k, v, **kw):  # cuDNN's shape-stable path (TORCH_CUDNN_SDPA_AVOID_RECOMPILE) needs BSHD-contiguous inputs
        seen.extend(x.transpose(1, 2).is_contiguous() for x in (q, k, v))
        return real_sdpa(q, k, v, **kw)

    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    got = dense_attention(q, k, v, (2, 4), 0.5, None)
    monkeypatch.undo()
    torch.testing.assert_close(got, _per_sequence(q, k, v, (0, 4, 8), 0.5))
    assert seen == [True, True, True]


def _qk(heads=4, kv_heads=2, d=8, dtype=torch.float32):
    return torch.zeros(1, heads, d, dtype=dtype), torch.zeros(1, kv_heads, d, dtype=dtype)


def test_the_plan_is_made_once_per_micro_batch_and_again_when_a_rule_changes(monkeypatch):
    calls = []
    real = attention_layout

    def counting(bounds, ratio, multiple):
        calls.append((ratio, multiple))
        return real(bounds, ratio, multiple)

    monkeypatch.setattr("slime.train.megatron.layers.attention_layout", counting)
    monkeypatch.setattr(SDPACoreAttention, "_dense_shapes", set())
    monkeypatch.setattr(SDPACoreAttention, "dense_length_multiple", 1)
    attn = SDPACoreAttention.__new__(SDPACoreAttention)  # the plan needs no module state
    p = PackedRoPEParams(qkv_format="thd", seq_bounds=(0, 5, 9))  # 2 x 5^2 <= 1.25 x (25 + 16)
    plans = [attn._dense_plan(p, *_qk()) for _ in range(3)]
    assert calls == [(1.25, 1)] and plans[0][0] == (2, 5) and plans[0][1].tolist() == list(range(9))
    monkeypatch.setattr(SDPACoreAttention, "dense_padding_ratio", 0.0)
    assert attn._dense_plan(p, *_qk()) is None and calls == [(1.25, 1), (0.0, 1)]


def test_the_longest_sequence_is_rounded_up_before_the_cost_is_weighed():
    assert attention_layout((0, 100, 200), 1.25, 128) is None  # 2 x 128^2 > 1.25 x 2 x 100^2
    assert attention_layout((0, 120, 240), 1.25, 128) == (2, 128)  # 2 x 128^2 <= 1.25 x 2 x 120^2
    assert attention_layout((0, 4096, 8192), 1.25, 128) == (2, 4096)
    assert dense_index((0, 120, 240), 128).tolist() == [*range(120), *range(128, 248)]


def test_shapes_past_the_budget_run_varlen_and_known_shapes_stay_dense(monkeypatch):
    """cuDNN builds a plan per new shape: only the first dense_shapes_max shapes of the process run dense."""
    monkeypatch.setattr(SDPACoreAttention, "_dense_shapes", set())
    monkeypatch.setattr(SDPACoreAttention, "dense_shapes_max", 2)
    monkeypatch.setattr(SDPACoreAttention, "dense_length_multiple", 1)
    attn = SDPACoreAttention.__new__(SDPACoreAttention)

    def plan(bounds, **qk):
        return attn._dense_plan(PackedRoPEParams(qkv_format="thd", seq_bounds=bounds), *_qk(**qk))

    assert plan((0, 4, 8))[0] == (2, 4) and plan((0, 5, 10))[0] == (3 - 1, 5)
    assert plan((0, 6, 12)) is None  # a third shape: varlen
    assert plan((0, 6, 12, 18)) is None and plan((0, 4, 8), d=16) is None  # another head size is another shape
    assert plan((0, 5, 10))[0] == (2, 5) and plan((0, 4, 8))[0] == (2, 4)  # known shapes stay dense
    assert len(SDPACoreAttention._dense_shapes) == 2


def test_the_padding_segment_gets_zeros_and_no_gradient_and_the_sequences_are_unchanged():
    torch.manual_seed(1)
    bounds, pad = (0, 5, 9, 14, 16), 2  # three sequences, then 2 tokens of padding that round t up
    real = bounds[:-1]
    layout = attention_layout(real, 1.5)
    assert layout == (3, 5)
    index = dense_index(real, layout[1])
    q0 = torch.randn(16, 4, 8, dtype=torch.float64)
    k0, v0 = torch.randn(16, 2, 8, dtype=torch.float64), torch.randn(16, 2, 8, dtype=torch.float64)
    grad = torch.randn(16, 4, 8, dtype=torch.float64)
    for idx, lay in ((index, layout), (None, (2, 5))):  # ragged (index) and uniform (a view) with padding after
        stop = 14 if idx is not None else 10
        q, k, v = (x[: stop + pad].clone().requires_grad_(True) for x in (q0, k0, v0))
        out = dense_attention(q, k, v, lay, 0.3, idx)
        out.backward(grad[: stop + pad])
        want = _per_sequence(q0[:stop], k0[:stop], v0[:stop], bounds[:-1] if idx is not None else (0, 5, 10), 0.3)
        torch.testing.assert_close(out[:stop].detach(), want, rtol=1e-10, atol=1e-12)
        assert out.shape == q.shape and torch.equal(out[stop:].detach(), torch.zeros(pad, 4, 8, dtype=torch.float64))
        assert not q.grad[stop:].any() and not k.grad[stop:].any() and not v.grad[stop:].any()


def test_the_plan_leaves_the_padding_segment_out_of_the_batch():
    attn = SDPACoreAttention.__new__(SDPACoreAttention)
    # 4 x 128 tokens and 1 of padding: with the padding as a fifth "sequence" the batch would be 5 x 128
    p = PackedRoPEParams(qkv_format="thd", seq_bounds=(0, 128, 256, 384, 512, 513), pad_tokens=1)
    assert attn._dense_plan(p, *_qk()) == ((4, 128), None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_never_plans_a_dense_batch_and_runs_each_sequence(monkeypatch, dtype):
    """The dense path is for CUDA half precision only: the CPU keeps the per-sequence path CI compares against."""
    from slime.train.megatron.layers import rope_cos_sin

    def refuse(*_):
        raise AssertionError("the dense path was planned on the CPU")

    monkeypatch.setattr(SDPACoreAttention, "_dense_plan", refuse)
    attn = SDPACoreAttention.__new__(SDPACoreAttention)
    object.__setattr__(attn, "softmax_scale", 0.3)  # nn.Module.__init__ is not needed for forward
    bounds = (0, 4, 8)
    cos, sin = rope_cos_sin(torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]), head_dim=8, rope_theta=1e4)
    p = PackedRoPEParams(qkv_format="thd", seq_bounds=bounds, rope_cos=cos, rope_sin=sin, max_seqlen_q=4)
    q, k, v = torch.randn(8, 4, 8, dtype=dtype), torch.randn(8, 2, 8, dtype=dtype), torch.randn(8, 2, 8, dtype=dtype)
    out = attn.forward(q, k, v, None, packed_seq_params=p)
    assert out.shape == (8, 32) and out.dtype == dtype


def test_the_step_metrics_give_the_share_of_dense_plans_and_start_over():
    attn = SDPACoreAttention.__new__(SDPACoreAttention)
    assert attention_path_metrics() == {}  # nothing planned (the CPU never plans)
    for bounds in ((0, 128, 256), (0, 128, 256, 384), (0, 4096, 4100)):  # dense, dense, varlen (one long, one short)
        attn._dense_plan(PackedRoPEParams(qkv_format="thd", seq_bounds=bounds), *_qk())
    assert attention_path_metrics() == {"attention_dense_fraction": pytest.approx(2 / 3)}
    assert attention_path_metrics() == {}
