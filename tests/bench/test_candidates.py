"""slime.bench.candidates: each candidate computes what the default computes, and swaps in only inside its block."""

from __future__ import annotations

import pytest
import torch

from slime.bench import candidates


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_swiglu_candidate_matches_autograd_of_silu_gate_times_up(dtype, tol):
    pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")
    torch.manual_seed(7)
    x = (3 * torch.randn(9, 1, 24, dtype=torch.float64)).to(dtype)
    g = torch.randn(9, 1, 12, dtype=torch.float64).to(dtype)
    got_x, ref_x = x.clone().requires_grad_(True), x.double().requires_grad_(True)
    out = candidates.swiglu(got_x)
    out.backward(g)
    gate, up = ref_x.chunk(2, dim=-1)
    (torch.nn.functional.silu(gate) * up).backward(g.double())
    assert out.dtype == dtype and got_x.grad is not None and got_x.grad.dtype == dtype
    torch.testing.assert_close(out.double(), torch.nn.functional.silu(gate) * up, rtol=tol, atol=tol)
    torch.testing.assert_close(got_x.grad.double(), ref_x.grad, rtol=tol, atol=tol)


def test_swiglu_candidate_backward_traces_as_one_graph():
    pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")
    torch._dynamo.reset()
    x, g = torch.randn(9, 1, 24), torch.randn(9, 1, 12)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    torch._dynamo.maybe_mark_dynamic(g, 0)
    traced = torch.compile(candidates._swiglu_backward, fullgraph=True, backend="aot_eager")(g, x)
    torch.testing.assert_close(traced, candidates._swiglu_backward(g, x), rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()


def test_each_candidate_swaps_in_only_inside_its_block():
    pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")
    from slime.train.megatron import layers

    default = layers._swiglu
    with candidates.CANDIDATES["swiglu_function"]():
        assert layers._swiglu is candidates.swiglu
    assert layers._swiglu is default
    with pytest.raises(RuntimeError), candidates.swiglu_function():
        raise RuntimeError("a failing benchmark")
    assert layers._swiglu is default

    from torch.nn.attention import varlen

    default_fn, default_choice = layers._VARLEN, varlen._should_use_cudnn
    with candidates.CANDIDATES["cudnn_varlen"]():
        assert layers._VARLEN is candidates.cudnn_varlen_attention and varlen._should_use_cudnn(0) is True
    assert layers._VARLEN is default_fn and varlen._should_use_cudnn is default_choice
