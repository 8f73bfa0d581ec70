"""The transformer layers' local linear layers (slime/train/megatron/linear.py): F.linear forward, the weight
gradient accumulated into megatron's ``main_grad`` where DDP gave one, megatron's function for any call
that communicates, and the same model outputs and gradients as megatron's own layers."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from slime.train.megatron import linear  # noqa: E402


def _data(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 1, 6, generator=g).to(dtype)
    w = torch.randn(4, 6, generator=g).to(dtype)
    b = torch.randn(4, generator=g).to(dtype)
    dy = torch.randn(5, 1, 4, generator=g).to(dtype)
    return x, w, b, dy


def test_forward_and_gradients_equal_f_linear_without_a_main_grad():
    x, w, b, dy = _data()
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    y = linear.local_linear(xs, ws, bs)
    yr = torch.nn.functional.linear(xr, wr, br)
    assert torch.equal(y, yr)
    y.backward(dy)
    yr.backward(dy)
    for a, r in ((xs, xr), (ws, wr), (bs, br)):
        assert torch.allclose(a.grad, r.grad, atol=1e-6)
    w2 = w.clone().requires_grad_()
    linear.local_linear(x, w2).backward(dy)  # no bias
    assert torch.allclose(w2.grad, wr.grad, atol=1e-6)


def test_the_weight_gradient_accumulates_into_main_grad_over_micro_batches_and_ddp_is_told():
    x, w, b, dy = _data()
    ws = w.clone().requires_grad_()
    ws.main_grad = torch.full_like(w, 0.5)  # what earlier micro-batches left
    ws.grad_added_to_main_grad = False
    expected = torch.full_like(w, 0.5)
    for seed in (1, 2):
        x, _, _, dy = _data(seed=seed)
        linear.local_linear(x, ws, b).backward(dy)
        expected += dy.reshape(-1, 4).t() @ x.reshape(-1, 6)
        assert ws.grad_added_to_main_grad  # megatron's DDP hook then skips its own add
        ws.grad = None  # as the hook does
    assert torch.allclose(ws.main_grad, expected, atol=1e-5)


def test_half_precision_weights_accumulate_into_fp32_or_hand_the_gradient_to_ddp():
    x, w, b, dy = _data(torch.bfloat16)
    ws = w.clone().requires_grad_()
    ws.main_grad = torch.zeros(w.shape, dtype=torch.float32)
    ws.grad_added_to_main_grad = False
    linear.local_linear(x, ws, b).backward(dy)
    reference = dy.float().reshape(-1, 4).t() @ x.float().reshape(-1, 6)
    got = ws.main_grad if ws.grad_added_to_main_grad else ws.main_grad + ws.grad.float()  # fused, or DDP adds
    assert torch.allclose(got, reference, atol=0.1, rtol=0.02)


def _ddp_hook(p):
    """megatron-core 0.19's DDP post-accumulate hook, as it treats param.grad."""
    if p.grad is not None and (not p.grad_added_to_main_grad or getattr(p, "zero_out_wgrad", False)):
        p.main_grad.add_(p.grad)
    p.grad = None


@pytest.mark.parametrize("fusable", [True, False])
@pytest.mark.parametrize("zero_out_wgrad", [False, True])
def test_under_ddps_hook_main_grad_is_exact_whether_or_not_the_gemm_can_fuse(monkeypatch, fusable, zero_out_wgrad):
    if not fusable:  # this device cannot accumulate these dtypes in the GEMM: a GEMM and an add, same contract
        monkeypatch.setattr(linear, "accumulate_wgrad", lambda *a: False)
    ws = _data()[1].clone().requires_grad_()
    ws.main_grad = torch.zeros(ws.shape)
    ws.grad_added_to_main_grad = False
    if zero_out_wgrad:  # megatron sets it on the tied embedding: its hook adds param.grad even when fused
        ws.zero_out_wgrad = True
    expected = torch.zeros(ws.shape)
    for seed in (1, 2, 3):
        x, _, b, dy = _data(seed=seed)
        linear.local_linear(x, ws, b).backward(dy)
        _ddp_hook(ws)
        expected += dy.reshape(-1, 4).t() @ x.reshape(-1, 6)
    assert ws.grad_added_to_main_grad
    assert torch.allclose(ws.main_grad, expected, atol=1e-5)


def test_a_frozen_weight_gets_no_gradient_computed():
    x, w, b, dy = _data()
    xs = x.clone().requires_grad_()
    linear.local_linear(xs, w, b).backward(dy)  # w does not require grad
    assert w.grad is None and xs.grad is not None


def test_accumulate_wgrad_refuses_what_it_cannot_do_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(linear, "_mixed_addmm_works", lambda device, dtype: False)
    main = torch.ones(4, 6)
    x, _, _, dy = _data(torch.bfloat16)
    assert not linear.accumulate_wgrad(main, dy.reshape(-1, 4), x.reshape(-1, 6))
    assert torch.equal(main, torch.ones(4, 6))


class _Layer:
    """Stand-in for megatron's layer: records calls that reach megatron's function."""

    def __init__(self):
        self.calls = []

    def _forward_impl(self, input, weight, *args, **kwargs):
        self.calls.append(kwargs)
        return "megatron"


class _Local(linear._LocalImpl, _Layer):
    pass


@pytest.mark.parametrize(
    "kwargs",
    [dict(allreduce_dgrad=True), dict(sequence_parallel=True), dict(gradient_accumulation_fusion=True), dict(grad_output_buffer=[]),
     dict(gtp_remat_size=2)],
)  # fmt: skip
def test_calls_that_communicate_or_defer_go_to_megatron(kwargs):
    x, w, b, _ = _data()
    layer = _Local()
    assert layer._forward_impl(input=x, weight=w.requires_grad_(), bias=b, **kwargs) == "megatron"
    assert layer._forward_impl(input=x, weight=w.detach(), bias=b) == "megatron"  # frozen weight: megatron's path
    out = layer._forward_impl(
        input=x, weight=w.requires_grad_(), bias=b, allreduce_dgrad=False, sequence_parallel=False
    )
    assert torch.allclose(out, torch.nn.functional.linear(x, w, b))
    linear.enabled = False
    try:
        assert layer._forward_impl(input=x, weight=w, bias=b) == "megatron"
    finally:
        linear.enabled = True


def test_a_built_model_swaps_only_the_transformer_layers_linears_and_keeps_megatrons_outputs_and_grads(
    hf_dirs, megatron_cpu
):
    """qwen2 (QKV bias): the same logits and parameter gradients through the local linears as through megatron's."""
    from megatron.core import tensor_parallel as tp

    from slime.config import MegatronConfig
    from slime.train.megatron.arch import ModelArch, load_hf_config
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config

    arch = ModelArch.from_hf_config(load_hf_config(hf_dirs["qwen2"]))
    model = build_gpt_model(arch, transformer_config(arch, MegatronConfig(), use_cpu_initialization=True), tp_size=1)
    load_hf_weights(model, HFCheckpointReader(hf_dirs["qwen2"]), arch, tp_size=1, tp_rank=0)
    kinds = {
        n: type(m) for n, m in model.named_modules() if isinstance(m, (tp.ColumnParallelLinear, tp.RowParallelLinear))
    }
    assert sum(".layers." in n for n in kinds) == 4 * arch.num_layers
    for name, cls in kinds.items():
        local = cls in (linear.LocalColumnParallelLinear, linear.LocalRowParallelLinear)
        assert local == (".layers." in name), name  # the output layer keeps megatron's class

    from slime.train.batch import TrainBatch
    from slime.train.megatron.packing import pack_samples

    lens = [9, 4]
    ids = torch.randint(0, arch.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    z = torch.zeros(2, 8)
    batch = TrainBatch(
        input_ids=ids, attention_mask=(torch.arange(9) < torch.tensor(lens)[:, None]).long(), loss_mask=z, rollout_logprobs=z,
        advantages=z, staleness=z.long(), sample_advantages=torch.zeros(2), rewards=torch.zeros(2), seq_lens=torch.tensor(lens),
        response_mask=z,
    )  # fmt: skip
    mb = pack_samples(batch, [0, 1], pad_token_id=0, pad_to=1, head_dim=arch.head_dim, rope_theta=arch.rope_theta)

    def run():
        model.zero_grad(set_to_none=True)
        logits = model(
            input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
        )
        (logits.float().square().mean()).backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    out, grads = run()
    linear.enabled = False
    try:
        out_m, grads_m = run()
    finally:
        linear.enabled = True
    assert torch.allclose(out, out_m, atol=1e-5)
    assert grads.keys() == grads_m.keys() and any("linear_qkv.bias" in n for n in grads)
    for n in grads:
        assert torch.allclose(grads[n], grads_m[n], atol=1e-6, rtol=1e-4), n


@pytest.mark.gpu
def test_on_cuda_bf16_weight_gradients_accumulate_into_fp32_main_grad_in_the_gemm():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 1, 512, device="cuda", generator=g).bfloat16()
    w = torch.randn(768, 512, device="cuda", generator=g).bfloat16().requires_grad_()
    b = torch.randn(768, device="cuda", generator=g).bfloat16().requires_grad_()
    dy = torch.randn(4096, 1, 768, device="cuda", generator=g).bfloat16()
    w.main_grad = torch.ones(768, 512, device="cuda")
    w.grad_added_to_main_grad = False
    y = linear.local_linear(x, w, b)
    assert torch.allclose(y.float(), torch.nn.functional.linear(x, w, b).float(), atol=1e-2)
    y.backward(dy)
    assert w.grad_added_to_main_grad, "aten.addmm.dtype_out did not run on this torch: DDP adds the gradient instead"
    reference = 1 + dy.float().reshape(-1, 768).t() @ x.float().reshape(-1, 512)
    err = (w.main_grad - reference).abs().max().item()
    assert err <= 1e-3 * reference.abs().max().item(), err  # fp32 accumulation, no bf16 rounding of the product
    assert torch.allclose(b.grad.float(), dy.float().sum((0, 1)), atol=0.5, rtol=1e-2)
