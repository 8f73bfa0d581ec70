"""The Triton SwiGLU kernels (slime/train/megatron/swiglu_kernel.py) against the eager formula, forward and
backward, through Triton's interpreter on the CPU (a subprocess: the interpreter is chosen when the kernels
are defined). The same kernels compiled on a GPU are checked by tests/gpu/megatron_logprob_parity.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from slime.train.megatron import swiglu_kernel

pytest.importorskip("triton")

_SCRIPT = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from slime.train.megatron.swiglu_kernel import available, swiglu

    def reference(x):
        g, u = x.double().chunk(2, dim=-1)
        return F.silu(g) * u

    torch.manual_seed(0)
    for shape, dtype, tol in (((3, 1, 2 * 1030), torch.float32, 1e-6), ((5, 2 * 7), torch.bfloat16, 2e-2), ((0, 1, 8), torch.float32, 0)):
        x = (torch.randn(shape) * 3).to(dtype).requires_grad_()
        xr = x.detach().clone().requires_grad_()
        assert available(x)
        y = swiglu(x)
        assert y.shape == (*shape[:-1], shape[-1] // 2) and y.dtype == dtype
        yr = reference(xr)
        dy = torch.randn(y.shape).to(dtype)
        y.backward(dy)
        yr.backward(dy.double())
        if x.numel():
            assert (y.double() - yr).abs().max() <= tol * max(1.0, yr.abs().max().item()), (shape, dtype)
            assert (x.grad.double() - xr.grad).abs().max() <= tol * max(1.0, xr.grad.abs().max().item()), (shape, dtype)
        assert x.grad.shape == x.shape and x.grad.dtype == dtype
    x = torch.randn(4, 6)[:, :4].requires_grad_()  # a non-contiguous view: made contiguous first
    swiglu(x).sum().backward()
    xr = x.detach().clone().requires_grad_()
    reference(xr).sum().backward()
    assert torch.allclose(x.grad.double(), xr.grad.double(), atol=1e-6)
    print("swiglu kernels OK")
    """
)


def test_triton_swiglu_matches_the_formula_forward_and_backward_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "swiglu kernels OK" in r.stdout


def test_available_refuses_cpu_tensors_without_the_interpreter_and_odd_widths(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not swiglu_kernel.available(torch.randn(2, 8))  # CPU, compiled Triton needs a GPU
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert swiglu_kernel.available(torch.randn(2, 8))
    assert not swiglu_kernel.available(torch.randn(2, 7))
    assert not swiglu_kernel.available(torch.ones(2, 8, dtype=torch.long))
    assert not swiglu_kernel.available(torch.ones(2, 8, dtype=torch.float64))  # the kernels compute in fp32
    assert not swiglu_kernel.available(torch.tensor(1.0))
