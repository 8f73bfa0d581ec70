"""The delta codec and the tensor wire helpers: every encoding decodes bit for bit, edge values included."""

from __future__ import annotations

import pytest
import torch

from slime.sync.codec import decode_payload, decode_tensor, encode_payload, encode_tensor
from slime.sync.wire import buckets, flatten, tensor_checksum, unflatten


def _roundtrip(name, old, new):
    enc = encode_tensor(name, old, new)
    control, metas, parts = decode_payload(encode_payload([enc], {"weight_version": "3"}))
    assert control == {"weight_version": "3"} and metas[name]["sha256"] == tensor_checksum(new)
    return enc, decode_tensor(name, metas[name], parts, old)


def _bits_equal(a, b):
    return torch.equal(
        a.contiguous().view(torch.int32 if a.element_size() == 4 else torch.int16),
        b.contiguous().view(torch.int32 if b.element_size() == 4 else torch.int16),
    )


def test_small_dense_steps_use_diff_and_edge_values_travel_as_exceptions():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(64, 64, generator=g)
    new = old - 1e-6 * torch.sign(torch.randn(64, 64, generator=g))
    old[0, :2] = torch.tensor([0.0, 1.0])
    new[0, :4] = torch.tensor([-0.0, 1e-8, float("nan"), float("inf")])  # 0 + -0 is +0; 1 + fl(1e-8 - 1) is 0
    enc, got = _roundtrip("w", old, new)
    assert enc.encoding == "diff" and enc.meta["num_exceptions"] == 2
    assert _bits_equal(got, new)


def test_few_changed_elements_use_sparse_steps():
    old = torch.randn(128, 32, generator=torch.Generator().manual_seed(1)).bfloat16()
    new = old.clone()
    new.view(-1)[::97] = new.view(-1)[::97] + 0.5
    enc, got = _roundtrip("w", old, new)
    assert enc.encoding == "sparse" and enc.nbytes < 0.1 * new.numel() * 2
    assert _bits_equal(got, new)


def test_unchanged_tensors_are_dropped_and_unrelated_ones_go_raw():
    old = torch.randn(16, 16, generator=torch.Generator().manual_seed(2))
    assert encode_tensor("w", old, old.clone()) is None
    enc, got = _roundtrip("w", old, torch.randn(16, 16, generator=torch.Generator().manual_seed(3)))
    assert enc.encoding == "raw"
    assert (
        encode_tensor("w", None, old).encoding == "raw"
        and encode_tensor("w", old, old + 1, full=True).encoding == "raw"
    )


def test_integer_tensors_never_use_float_diff():
    old = torch.arange(1000, dtype=torch.int64)
    new = old.clone()
    new[7] = -5
    enc, got = _roundtrip("ids", old, new)
    assert enc.encoding == "sparse" and torch.equal(got, new)


def test_a_delta_without_its_base_or_with_a_bad_payload_is_refused():
    old = torch.randn(8, 8, generator=torch.Generator().manual_seed(4))
    enc = encode_tensor("w", old, old + 1e-3)
    _, metas, parts = decode_payload(encode_payload([enc], {}))
    with pytest.raises(ValueError, match="needs the old"):
        decode_tensor("w", metas["w"], parts, None)
    with pytest.raises(ValueError, match="needs the old"):
        decode_tensor("w", metas["w"], parts, old[:4])
    with pytest.raises(ValueError, match="not a slime delta payload"):
        decode_payload(b"\x00" * 16)
    with pytest.raises(ValueError, match="differ|vs new"):
        encode_tensor("w", old.double(), old)


def test_buckets_keep_order_and_flat_buckets_roundtrip_mixed_dtypes():
    sizes = [4, 4, 4, 12, 2]
    got = buckets([(str(i), torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate(sizes)], 8)
    assert [[n for n, _ in b] for b in got] == [["0", "1"], ["2"], ["3"], ["4"]]
    tensors = [
        torch.ones(3, dtype=torch.bfloat16),
        torch.arange(6.0).reshape(2, 3),
        torch.tensor([7], dtype=torch.int64),
    ]
    back = unflatten(
        flatten(tensors), [t.dtype for t in tensors], [t.shape for t in tensors]
    )  # offsets 6 and 30: unaligned
    assert all(torch.equal(a, b) for a, b in zip(tensors, back))
    with pytest.raises(ValueError, match="holds 37 bytes"):
        unflatten(flatten(tensors)[:-1], [t.dtype for t in tensors], [t.shape for t in tensors])
