"""The delta loader a real SGLang server would run, against a stand-in model with ``load_weights``."""

from __future__ import annotations

import pytest
import torch

from slime.sync.codec import encode_payload, encode_tensor
from slime.sync.sglang_loader import load_delta


class _Model:
    """Records what SGLang's ``model.load_weights`` would get (full HF-named tensors)."""

    def __init__(self):
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, named):
        self.loaded.update({n: t.clone() for n, t in named})


def _named(payload: bytes):
    return [("slime_delta", torch.frombuffer(bytearray(payload), dtype=torch.uint8))]


def test_a_delta_needs_a_full_sync_first_then_rebuilds_full_tensors():
    g = torch.Generator().manual_seed(0)
    v1 = {"a": torch.randn(32, 8, generator=g).bfloat16(), "b": torch.randn(8, generator=g).bfloat16()}
    v2 = {"a": v1["a"].clone(), "b": v1["b"] + 0.5}
    v2["a"][0, :3] += 1.0
    delta = encode_payload([e for n in v2 if (e := encode_tensor(n, v1[n], v2[n])) is not None], {})
    model = _Model()
    with pytest.raises(ValueError, match="needs the old"):
        load_delta(model, _named(delta))
    assert model.loaded == {}
    load_delta(model, _named(encode_payload([encode_tensor(n, None, t) for n, t in v1.items()], {})))
    load_delta(model, _named(delta))
    assert all(torch.equal(model.loaded[n], v2[n]) for n in v2)


def test_a_checksum_mismatch_loads_nothing():
    t = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    enc = encode_tensor("a", None, t)
    enc.meta["sha256"] = "0" * 64  # as if the payload had been damaged on the way
    model = _Model()
    with pytest.raises(ValueError, match="sha256 mismatch"):
        load_delta(model, _named(encode_payload([enc], {})))
    assert model.loaded == {}
