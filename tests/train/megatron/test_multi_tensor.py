"""The torch-foreach stand-ins for megatron-core's multi-tensor fallbacks (slime/train/megatron/multi_tensor.py):
same results as megatron's local versions, no Python float per tensor, and only the fallbacks are swapped."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from slime.train.megatron.multi_tensor import foreach_l2_norm, foreach_scale, use_foreach_multi_tensor_ops  # noqa: E402


def _tensors(seed: int, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for shape in ((7,), (3, 5), (2, 2, 4), (1,))]


def test_foreach_l2_norm_is_the_norm_of_all_tensors_and_never_makes_a_python_float(monkeypatch):
    ts = _tensors(0)
    expected = torch.cat([t.flatten() for t in ts]).double().norm()
    monkeypatch.setattr(torch.Tensor, "__float__", lambda self: pytest.fail("a host sync: float() of a tensor"))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("a host sync: .item()"))
    norm, per_tensor = foreach_l2_norm(2048, torch.zeros(1, dtype=torch.int), [ts], False)
    monkeypatch.undo()
    assert per_tensor is None and norm.shape == (1,) and norm.dtype == torch.float32
    assert float(norm) == pytest.approx(float(expected), rel=1e-6)
    with pytest.raises(ValueError, match="no tensors"):
        foreach_l2_norm(2048, torch.zeros(1, dtype=torch.int), [[]], False)


def test_foreach_l2_norm_of_bf16_grads_accumulates_in_fp32():
    ts = _tensors(1, torch.bfloat16)
    expected = torch.cat([t.float().flatten() for t in ts]).norm()
    norm, _ = foreach_l2_norm(2048, torch.zeros(1, dtype=torch.int), [ts], False)
    assert norm.dtype == torch.float32 and float(norm) == pytest.approx(float(expected), rel=1e-6)


def test_foreach_l2_norm_takes_fp64_like_megatrons_local_version():
    ts = _tensors(4, torch.float64)
    norm, _ = foreach_l2_norm(2048, torch.zeros(1, dtype=torch.int), [ts], False)
    assert norm.dtype == torch.float32 and float(norm) == pytest.approx(
        float(torch.cat([t.flatten() for t in ts]).norm()), rel=1e-6
    )


def test_foreach_scale_matches_megatrons_local_scale_across_dtypes_and_in_place():
    from megatron.core.utils import local_multi_tensor_scale

    src = _tensors(2)
    ours, theirs = (
        [torch.zeros_like(t, dtype=torch.bfloat16) for t in src],
        [torch.zeros_like(t, dtype=torch.bfloat16) for t in src],
    )
    for scale in (1.0, 0.37):
        foreach_scale(2048, None, [src, ours], scale)
        local_multi_tensor_scale(2048, None, [src, theirs], scale)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    grads = _tensors(3)
    expected = [g * 0.5 for g in grads]
    foreach_scale(2048, None, [grads, grads], 0.5)  # clipping scales the gradients in place
    assert all(torch.equal(a, b) for a, b in zip(grads, expected))
    foreach_scale(2048, None, [[], []], 0.5)
    with pytest.raises(ValueError, match="2 sources for 1 destinations"):
        foreach_scale(2048, None, [grads[:2], grads[:1]], 0.5)


def test_only_megatrons_local_fallbacks_are_replaced(monkeypatch):
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.optimizer as optimizer
    from megatron.core import utils

    monkeypatch.setattr(clip_grads, "l2_norm_impl", utils.local_multi_tensor_l2_norm)
    monkeypatch.setattr(clip_grads, "multi_tensor_scale_impl", utils.local_multi_tensor_scale)
    apex_like = object()  # an installed library's kernel stays
    monkeypatch.setattr(optimizer, "multi_tensor_scale_impl", apex_like)
    done = use_foreach_multi_tensor_ops()
    assert done == {
        "clip_grads.l2_norm_impl": "foreach",
        "clip_grads.multi_tensor_scale_impl": "foreach",
        "optimizer.multi_tensor_scale_impl": "kept",
    }
    assert clip_grads.l2_norm_impl is foreach_l2_norm and clip_grads.multi_tensor_scale_impl is foreach_scale
    assert optimizer.multi_tensor_scale_impl is apex_like
    assert use_foreach_multi_tensor_ops() == done  # idempotent
