"""Weight sync buckets for SGLang's MLA models (GLM-4.7-Flash, DeepSeek-V3): SGLang 0.5.17 fuses a layer's
``q_a_proj`` and ``kv_a_proj_with_mqa`` only when both arrive in one ``load_weights`` call (one bucket), so
``slime.sync.wire.buckets`` never cuts between them, on the tiny GLM-4.7-Flash's own export order."""

from __future__ import annotations

import torch

from slime.sync.wire import buckets


def _export_order() -> list[tuple[str, torch.Tensor]]:
    """One MLA layer's tensors in the order weight sync sends them (``convert.mcore_names``), 4 bytes each."""
    pre = "model.layers.1.self_attn."
    names = ["q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight"]
    names += ["kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"]
    return [(pre + n, torch.zeros(1)) for n in names]


def test_a_layers_q_a_and_kv_a_projections_share_a_bucket():
    got = [[n.rsplit(".", 2)[1] for n, _ in b] for b in buckets(_export_order(), max_bytes=4)]
    assert got == [
        ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa"],
        ["kv_a_layernorm"],
        ["kv_b_proj"],
        ["o_proj"],
    ]


def test_other_tensors_still_split_at_max_bytes():
    named = [(f"model.layers.0.mlp.experts.{i}.down_proj.weight", torch.zeros(1)) for i in range(3)]
    assert [len(b) for b in buckets(named, max_bytes=8)] == [2, 1]


def test_the_delta_sync_keeps_the_pair_in_one_bucket_too():
    from slime.sync.codec import EncodedTensor
    from slime.sync.delta import _buckets

    encoded = [EncodedTensor(n, "dense", {}, {"v": t}) for n, t in _export_order()]
    got = [[e.name.rsplit(".", 2)[1] for e in b] for b in _buckets(encoded, max_bytes=4)]
    assert got[0] == ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa"] and len(got) == 4
    assert _buckets([], max_bytes=4) == [[]]  # nothing changed: one request that only sets weight_version
