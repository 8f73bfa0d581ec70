"""slime.train.megatron.swiglu: the autograd Function's forward and hand-written backward against autograd of
``silu(gate) * up`` in float64, in each dtype; the backward traces as one graph (what Inductor compiles on a GPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")

from slime.train.megatron import swiglu  # noqa: E402


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_swiglu_matches_autograd_of_silu_gate_times_up(dtype, tol):
    torch.manual_seed(7)
    x = (3 * torch.randn(9, 1, 24, dtype=torch.float64)).to(dtype)
    g = torch.randn(9, 1, 12, dtype=torch.float64).to(dtype)
    got_x, ref_x = x.clone().requires_grad_(True), x.double().requires_grad_(True)
    out = swiglu.swiglu(got_x)
    out.backward(g)
    gate, up = ref_x.chunk(2, dim=-1)
    (torch.nn.functional.silu(gate) * up).backward(g.double())
    assert out.dtype == dtype and got_x.grad is not None and got_x.grad.dtype == dtype
    torch.testing.assert_close(out.double(), torch.nn.functional.silu(gate) * up, rtol=tol, atol=tol)
    torch.testing.assert_close(got_x.grad.double(), ref_x.grad, rtol=tol, atol=tol)


def test_swiglu_backward_traces_as_one_graph():
    torch._dynamo.reset()
    x, g = torch.randn(9, 1, 24), torch.randn(9, 1, 12)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    torch._dynamo.maybe_mark_dynamic(g, 0)
    traced = torch.compile(swiglu.swiglu_backward.fn, fullgraph=True, backend="aot_eager")(g, x)
    torch.testing.assert_close(traced, swiglu.swiglu_backward.fn(g, x), rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()
