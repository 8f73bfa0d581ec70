"""slime.bench.candidates: each candidate swaps in only inside its block."""

from __future__ import annotations

import pytest

from slime.bench import candidates


def test_each_candidate_swaps_in_only_inside_its_block():
    pytest.importorskip(
        "megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed"
    )
    from slime.train.megatron.layers import SDPACoreAttention

    ratio = SDPACoreAttention.dense_padding_ratio
    assert ratio > 0
    with candidates.CANDIDATES["varlen_attention"]():
        assert SDPACoreAttention.dense_padding_ratio == 0
    assert SDPACoreAttention.dense_padding_ratio == ratio
    with pytest.raises(RuntimeError), candidates.varlen_attention():
        raise RuntimeError("a failing benchmark")
    assert SDPACoreAttention.dense_padding_ratio == ratio
    from slime.train.megatron.layers import SwiGLUMLP

    assert SwiGLUMLP.use_triton
    with candidates.CANDIDATES["compiled_swiglu"]():
        assert not SwiGLUMLP.use_triton
    assert SwiGLUMLP.use_triton
    with pytest.raises(RuntimeError), candidates.compiled_swiglu():
        raise RuntimeError("a failing benchmark")
    assert SwiGLUMLP.use_triton
    from slime.train.megatron import linear

    assert linear.enabled
    with candidates.CANDIDATES["megatron_linear"]():
        assert not linear.enabled
    assert linear.enabled
