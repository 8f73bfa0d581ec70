"""Kernel candidates for the megatron backend, measured in the model side by side with the default before
one replaces it (or, once it has, the old default beside the new one): ``scripts/gpu/bench_trainer.py
--backends transformers,megatron,megatron+NAME`` builds the megatron backend a second time inside
``CANDIDATES[NAME]()``, which swaps the candidate in for that backend's build and steps only (after the
default's, in the order of ``--backends``: put the candidate first in a second run to see order effects).
Only the megatron backend takes candidates; ``megatron+A+B`` swaps in several.

    varlen_attention  packed attention always through torch's varlen flash kernel (the default before the
                      dense path: ``SDPACoreAttention.dense_padding_ratio`` = 0).
    megatron_linear   the transformer layers' linear layers through megatron-core's own function (bias added after
                      the GEMM, weight gradient added to ``main_grad`` by DDP: the default before
                      ``slime/train/megatron/linear.py``).
    compiled_swiglu   SwiGLU through Inductor's kernels (``layers._swiglu``; the default before the Triton
                      kernels of ``slime/train/megatron/swiglu_kernel.py``: ``SwiGLUMLP.use_triton`` = False).

Tried and removed (docs/benchmarks.md): ``swiglu_function``, SwiGLU as an autograd Function with a hand-written
backward (megatron-core's ``bias_swiglu_impl`` structure): faster alone in the kernel micro-bench, in the model
+1 %, -1.7 % and 0 % of the RL step in three side-by-side runs at the Qwen2-1.5B shape. ``cudnn_varlen``, cuDNN's ragged SDPA through the cuDNN branch of torch's own varlen op
(kept off in torch 2.11-2.13). On an H200 with torch 2.11 its backward raised (``_cudnn_attention_backward``
got an int for ``attn_bias``) and fwd+bwd took 50-66 ms against varlen's 1.1-2.9 ms (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

__all__ = ["CANDIDATES", "compiled_swiglu", "megatron_linear", "varlen_attention"]


@contextmanager
def _set(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name = value`` inside the block, the old value restored after it (also on an error)."""
    default = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, default)


def varlen_attention() -> AbstractContextManager[None]:
    """Every packed micro-batch takes the varlen kernel inside the block (no dense, padded batch)."""
    from slime.train.megatron.layers import SDPACoreAttention

    return _set(SDPACoreAttention, "dense_padding_ratio", 0.0)


def compiled_swiglu() -> AbstractContextManager[None]:
    """SwiGLU runs Inductor's compiled kernels inside the block (not the Triton ones)."""
    from slime.train.megatron.layers import SwiGLUMLP

    return _set(SwiGLUMLP, "use_triton", False)


def megatron_linear() -> AbstractContextManager[None]:
    """The transformer layers' linear layers run megatron-core's function inside the block."""
    from slime.train.megatron import linear

    return _set(linear, "enabled", False)


CANDIDATES: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "varlen_attention": varlen_attention,
    "compiled_swiglu": compiled_swiglu,
    "megatron_linear": megatron_linear,
}
