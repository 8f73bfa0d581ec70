"""The fused logprob/entropy function and the compiled elementwise chains, on the CPU.

``vocab_parallel_logprobs`` (two row passes, hand-written backward) against ``torch.log_softmax`` +
``gather`` and the softmax entropy through plain autograd in float64: values, and gradients of a
random mix of logprob and entropy; with vocabulary padding, temperature, bf16 input, eager chunks,
and TP=2 (two gloo processes). The ``fusion.fused`` functions are also traced by ``torch.compile``
(``aot_eager``, full graph, token dimension dynamic): what Inductor compiles on the GPU is exactly
this graph.
"""

from __future__ import annotations

import socket

import pytest
import torch

from slime.train.megatron import logprobs  # needs no megatron-core (so the TP workers start fast)
from slime.train.megatron.logprobs import vocab_parallel_logprobs


def _reference(
    logits: torch.Tensor, target: torch.Tensor, temperature: float, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 log_softmax over the real vocabulary, gathered at ``target``, and the entropy."""
    scale = 1.0 / temperature if temperature > 1e-6 else 1.0
    ref = torch.log_softmax(logits[:, :vocab_size].double() * scale, -1)
    return ref.gather(-1, target[:, None])[:, 0], -(ref.exp() * ref).sum(-1)


def _check(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    temperature: float,
    vocab_size: int,
    atol: float,
    grad_atol: float,
    grad_rtol: float = 0.0,
) -> None:
    x = logits.detach().clone().requires_grad_(True)
    lp, ent = vocab_parallel_logprobs(x, target, temperature=temperature, vocab_size=vocab_size, entropy_grad=True)
    x_ref = logits.detach().clone().double().requires_grad_(True)
    lp_ref, ent_ref = _reference(x_ref, target, temperature, vocab_size)
    assert lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp.double(), lp_ref, rtol=0, atol=atol)
    torch.testing.assert_close(ent.double(), ent_ref, rtol=0, atol=atol)
    w_lp, w_ent = torch.randn(len(target)), torch.randn(len(target))
    ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
    ((lp_ref * w_lp.double()).sum() + (ent_ref * w_ent.double()).sum()).backward()
    assert x.grad.dtype == logits.dtype
    torch.testing.assert_close(x.grad.double(), x_ref.grad, rtol=grad_rtol, atol=grad_atol)
    assert torch.equal(x.grad[:, vocab_size:], torch.zeros_like(x.grad[:, vocab_size:]))


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_values_and_gradients_match_log_softmax_gather_and_entropy(temperature):
    torch.manual_seed(0)
    logits = 4 * torch.randn(23, 101)  # 97 real tokens + 4 padding rows, a wide spread of logits
    target = torch.randint(0, 97, (23,))
    _check(logits, target, temperature=temperature, vocab_size=97, atol=2e-5, grad_atol=5e-6)  # fp32 on |z| up to ~30


def test_bf16_logits_are_computed_in_fp32_and_get_a_bf16_gradient():
    torch.manual_seed(1)
    logits = (3 * torch.randn(17, 64)).bfloat16()
    target = torch.randint(0, 60, (17,))
    _check(
        logits, target, temperature=0.8, vocab_size=60, atol=2e-5, grad_atol=1e-5, grad_rtol=4e-3
    )  # grad rounded to bf16 (relative 2^-9)


def test_logprob_only_gradient_and_a_detached_entropy():
    torch.manual_seed(2)
    logits = torch.randn(9, 30, requires_grad=True)
    target = torch.randint(0, 28, (9,))
    lp, ent = vocab_parallel_logprobs(logits, target, temperature=0.7, vocab_size=28)
    assert lp.requires_grad and not ent.requires_grad
    w = torch.randn(9)
    (lp * w).sum().backward()
    x_ref = logits.detach().double().requires_grad_(True)
    (_reference(x_ref, target, 0.7, 28)[0] * w.double()).sum().backward()
    torch.testing.assert_close(logits.grad.double(), x_ref.grad, rtol=0, atol=1e-6)
    with torch.no_grad():  # the old-logprob pass
        lp2, ent2 = vocab_parallel_logprobs(logits, target, temperature=0.7, vocab_size=28)
    torch.testing.assert_close(lp2, lp.detach())
    torch.testing.assert_close(ent2, ent)


def test_eager_chunks_give_the_same_values_and_gradients(monkeypatch):
    torch.manual_seed(3)
    logits = 2 * torch.randn(50, 40)
    target = torch.randint(0, 37, (50,))
    whole = []
    for chunk in (1 << 26, 7 * 40):  # one chunk; eight chunks of 7 tokens (the last one short)
        monkeypatch.setattr(logprobs, "_CHUNK_ELEMENTS", chunk)
        x = logits.clone().requires_grad_(True)
        lp, ent = vocab_parallel_logprobs(x, target, temperature=0.9, vocab_size=37, entropy_grad=True)
        (lp.sum() - 0.3 * ent.sum()).backward()
        whole.append((lp.detach(), ent.detach(), x.grad))
    for a, b in zip(*whole):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(
    rank: int, port: int, logits: torch.Tensor, target: torch.Tensor, w_lp: torch.Tensor, w_ent: torch.Tensor, out: dict
) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        half = logits.shape[1] // 2
        x = logits[:, rank * half : (rank + 1) * half].clone().requires_grad_(True)
        lp, ent = vocab_parallel_logprobs(
            x, target, temperature=0.75, vocab_size=70, tp_rank=rank, group=dist.group.WORLD, entropy_grad=True
        )
        ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
        out[rank] = (lp.detach(), ent.detach(), x.grad)
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_slices_give_the_full_vocabulary_result():
    """TP=2 over gloo (threads would share one process group; two processes it is): vocabulary 70
    padded to 2 x 48, so rank 1 holds 22 real columns and 26 padding ones."""
    import torch.multiprocessing as mp

    torch.manual_seed(4)
    logits = 3 * torch.randn(11, 96)
    target = torch.randint(0, 70, (11,))
    target[0], target[1] = 47, 48  # the last column of rank 0, the first of rank 1
    w_lp, w_ent = torch.randn(11), torch.randn(11)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(
            _tp_worker, args=(_free_port(), logits, target, w_lp, w_ent, out), nprocs=2, start_method="spawn"
        )
        results = dict(out)
    x_ref = logits.double().requires_grad_(True)
    lp_ref, ent_ref = _reference(x_ref, target, 0.75, 70)
    ((lp_ref * w_lp.double()).sum() + (ent_ref * w_ent.double()).sum()).backward()
    for rank in (0, 1):
        lp, ent, grad = results[rank]
        torch.testing.assert_close(lp.double(), lp_ref, rtol=0, atol=2e-5)
        torch.testing.assert_close(ent.double(), ent_ref, rtol=0, atol=2e-5)
        torch.testing.assert_close(grad.double(), x_ref.grad[:, rank * 48 : (rank + 1) * 48], rtol=0, atol=1e-6)


def _traced(fn, *args):
    """``fn`` through torch.compile (aot_eager: dynamo + AOTAutograd, no codegen), full graph, dim 0 dynamic."""
    torch._dynamo.reset()
    for i in fn.dynamic_args:
        if isinstance(args[i], torch.Tensor):
            torch._dynamo.maybe_mark_dynamic(args[i], 0)
    return torch.compile(fn.fn, fullgraph=True, backend="aot_eager")(*args)


def test_logprob_passes_trace_as_one_graph_and_match_eager():
    torch.manual_seed(5)
    x = (3 * torch.randn(13, 50)).bfloat16()
    tgt = torch.randint(0, 45, (13,))
    for got, want in zip(_traced(logprobs._row_stats, x, tgt, 1.25, 45), logprobs._row_stats.fn(x, tgt, 1.25, 45)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    lse, c_lp, c_ent, mean_z = torch.randn(13) + 5, torch.randn(13), torch.randn(13), torch.randn(13)
    for extra in ((c_ent, mean_z), (None, None)):
        got = _traced(logprobs._logits_grad, x, tgt, lse, c_lp, *extra, 1.25, 45)
        want = logprobs._logits_grad.fn(x, tgt, lse, c_lp, *extra, 1.25, 45)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=1e-2)


def test_rmsnorm_rope_swiglu_trace_as_one_graph_and_match_eager_with_gradients():
    pytest.importorskip(
        "megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed"
    )
    from slime.train.megatron import layers

    torch.manual_seed(6)
    cos, sin = layers.rope_cos_sin(torch.arange(9) % 5, head_dim=16, rope_theta=1e4)
    cases = [
        (layers._rms_norm, (torch.randn(9, 1, 32), torch.randn(32), 1e-6)),
        (layers._rope_qk, (torch.randn(9, 4, 16), torch.randn(9, 2, 16), cos, sin)),
        (layers._swiglu, (torch.randn(9, 1, 24),)),
    ]
    for fn, args in cases:
        grads = []
        for run in (lambda *a: _traced(fn, *a), fn.fn):  # noqa: B023  # called within this iteration
            leaves = [
                a.clone().requires_grad_(True)
                if isinstance(a, torch.Tensor) and a.dtype == torch.float32 and a is not cos and a is not sin
                else a
                for a in args
            ]
            outs = run(*leaves)
            outs = outs if isinstance(outs, tuple) else (outs,)
            sum(o.square().sum() for o in outs).backward()
            grads.append(
                [o.detach() for o in outs] + [a.grad for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
            )
        for got, want in zip(*grads):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_only_the_token_dimension_is_dynamic_across_hidden_sizes(monkeypatch):
    """A second row width recompiles with that width static: dynamo's automatic dynamic shapes would
    make it symbolic, and Inductor's kernels for a symbolic width are 2-4x slower (fusion docstring)."""
    from torch._dynamo.testing import CompileCounter

    from slime.train.megatron import fusion

    torch._dynamo.reset()
    counter = CompileCounter()
    monkeypatch.setattr(fusion, "_BACKEND", counter)
    fn = fusion._Fused(lambda x: x * 2.0, dynamic_args=(0,))
    monkeypatch.setattr(fusion, "_REGISTRY", [fn])
    monkeypatch.setattr(fusion._Fused, "compiles_for", lambda self, x: True)
    fn(torch.randn(8, 4))
    fn(torch.randn(5, 4))  # token count: dynamic, no recompile
    assert counter.frame_count == 1
    fn(torch.randn(8, 6))
    fn(torch.randn(3, 6))
    assert counter.frame_count == 2
    fn(torch.randn(8, 10))  # with automatic dynamic shapes the width-6 graph would have a symbolic width and serve this
    assert counter.frame_count == 3
    torch._dynamo.reset()
