"""slime.bench.candidates: each candidate computes what the default computes, and swaps in only inside its block."""

from __future__ import annotations

import pytest

from slime.bench import candidates


def test_each_candidate_swaps_in_only_inside_its_block():
    pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")
    from slime.train.megatron import layers, swiglu

    default = layers._swiglu
    assert default is swiglu.swiglu
    with candidates.CANDIDATES["swiglu_autodiff"]():
        assert layers._swiglu is swiglu.swiglu_forward
    assert layers._swiglu is default
    with pytest.raises(RuntimeError), candidates.swiglu_autodiff():
        raise RuntimeError("a failing benchmark")
    assert layers._swiglu is default

    ratio = layers.SDPACoreAttention.dense_padding_ratio
    assert ratio > 0
    with candidates.CANDIDATES["varlen_attention"]():
        assert layers.SDPACoreAttention.dense_padding_ratio == 0
    assert layers.SDPACoreAttention.dense_padding_ratio == ratio
