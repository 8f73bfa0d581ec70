"""The modules slime plugs into megatron-core's local layer spec: RMSNorm, SDPA core attention, SwiGLU MLP, MoE router gate
(and the output layer as a pass-through).

``RMSNorm`` computes what HF's Llama/Qwen RMSNorm computes (normalise in fp32, cast back, then
scale), so bf16 logprobs match the torch backend's; it also marks its weight for megatron's
sequence-parallel gradient all-reduce, which torch's own ``nn.RMSNorm`` (the local spec's choice,
``WrappedTorchNorm``) refuses to run under.

On CUDA the elementwise chains here (RMSNorm, RoPE, SwiGLU) run as ``torch.compile`` kernels
(``slime.train.megatron.fusion``), one pass each way instead of one per ATen op. Eager (CPU) they
are HF's exact op sequence; compiled, Inductor may skip an intermediate bf16 rounding (it keeps
fp32 inside a fused kernel), a difference of about one bf16 ulp in some elements.

``SDPACoreAttention`` replaces the local spec's ``DotProductAttention`` (an unfused
``baddbmm`` + softmax + ``bmm`` that materialises [b, heads, s, s]). It runs on packed ("thd")
micro-batches only and does two things there:

1. RoPE, from per-token cos/sin that ``PackedRoPEParams`` carries (positions restart at every
   packed sequence). The model is built with ``position_embedding_type="none"``, so megatron's own
   RoPE (whose "thd" path splits by ``cu_seqlens`` with host syncs in every layer) never runs. The
   order is megatron's and HF's: q/k projection -> q/k RMSNorm (Qwen3) -> RoPE -> attention.
2. Causal attention within each packed sequence. On CUDA in bf16/fp16 one of two kernels per
   micro-batch (``SDPACoreAttention._dense_plan``): when the sequences are close in length (b * L^2 <=
   ``dense_padding_ratio`` * sum(l^2), b sequences, L the longest rounded up to
   ``dense_length_multiple``) and the shape (b, L) is one of the first ``dense_shapes_max`` the process
   ran, ``F.scaled_dot_product_attention`` on the sequences right-padded to a dense [b, heads, L, d]
   batch (cuDNN's Hopper kernels: 1.5-2.0x the varlen kernel's speed on an H200 at equal lengths,
   docs/bench_kernels_h200.json; causal masking keeps every real query off the padding, so the result
   is exact); otherwise ``torch.nn.attention.varlen.varlen_attn`` (flash attention over all packed
   sequences at once, no padding) when this torch has it. The shape budget bounds cuDNN's plan builds
   (one per new shape, reported at 55-400 ms). Elsewhere (CPU, fp32)
   ``F.scaled_dot_product_attention(is_causal=True)`` once per sequence (math on CPU).

Under context parallelism (``PackedRoPEParams.cp_size`` > 1) step 2 is
``slime.train.megatron.context_parallel.cp_attention``: K/V all-gathered over the CP group, each
local query chunk attending its sequence's keys up to its own position.

Not covered: dropout inside attention (RL training runs without it), sliding windows, attention
sinks, and unpacked ("sbhd") input (raises).

``TorchGatingRouter`` is megatron-core's ``TopKRouter`` with its gate as a plain ``F.linear`` in the
router dtype. megatron-core 0.16.1's own gate (``RouterGatingLinearFunction``) names
``te_general_gemm``, which only exists when Transformer Engine imports, so without TE every MoE
forward raised NameError. Same math (``x @ W.T`` in fp32), autograd saves the fp32 copies.

``HiddenStatesOutput`` is the output layer as a pass-through, for ``--logprob-impl liger``
(``slime.train.megatron.model.output_hidden_states``).

Shapes: t = packed tokens of the micro-batch, n = query heads on this TP rank, g = key/value heads
on this rank, d = head_dim.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from slime.train.megatron import swiglu_kernel
from slime.train.megatron._mcore import mcore
from slime.train.megatron.context_parallel import cp_attention
from slime.train.megatron.dense_attention import attention_layout, dense_attention, dense_index
from slime.train.megatron.fusion import fused

if TYPE_CHECKING:  # megatron-core ships no type information: these name its classes (mypy reads them as Any)
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = [
    "RMSNorm",
    "attention_path_metrics",
    "SDPACoreAttention",
    "SwiGLUMLP",
    "TorchGatingRouter",
    "PackedRoPEParams",
    "rope_cos_sin",
]

_PackedSeqParams: Any = mcore("megatron.core.packed_seq_params").PackedSeqParams
_MegatronModule: Any = mcore("megatron.core.transformer.module").MegatronModule
_MLP: Any = mcore("megatron.core.transformer.mlp").MLP
_TopKRouter: Any = mcore("megatron.core.transformer.moe.router").TopKRouter
_ColumnParallelLinear: Any = mcore("megatron.core.tensor_parallel").ColumnParallelLinear


@dataclasses.dataclass
class PackedRoPEParams(_PackedSeqParams):
    """megatron-core's ``PackedSeqParams`` ("thd") plus what ``SDPACoreAttention`` needs.

    Attributes (beyond the parent's ``cu_seqlens_q/kv`` [S+1] int32 and ``max_seqlen_q/kv``):
        seq_bounds: host copy of ``cu_seqlens`` (S+1 ints), so the per-sequence path never syncs.
        rope_cos / rope_sin: [t, 1, d] float32, cos/sin of each token's angle at its position in
            its own sequence (HF layout: the d/2 frequencies repeated twice).
        cp_size / cp_rank / cp_group: context parallelism (``slime.train.megatron.context_parallel``);
            with cp_size > 1, t, ``seq_bounds`` and the RoPE tables are this rank's share, the
            ``cu_seqlens`` too, ``cp_full_bounds`` the segments of the full stream and
            ``cp_full_index`` [T] int64 the gather order (``context_parallel.cp_split``).
        pad_tokens: length of the last segment when it is the padding that rounds t up (no CP);
            its tokens' attention outputs are never used, and the dense path leaves them zero.
    """

    seq_bounds: tuple[int, ...] = ()
    rope_cos: Tensor | None = None
    rope_sin: Tensor | None = None
    cp_size: int = 1
    cp_rank: int = 0
    cp_group: Any = None
    cp_full_index: Tensor | None = None
    cp_full_bounds: tuple[int, ...] = ()
    pad_tokens: int = 0
    dense_plan: Any = None  # SDPACoreAttention._dense_plan's cache: (its rules, (layout, index) or None)


def rope_cos_sin(
    position_ids: Tensor, *, head_dim: int, rope_theta: float, rotary_dim: int | None = None
) -> tuple[Tensor, Tensor]:
    """HF's default RoPE tables for ``position_ids`` [t]: cos and sin, each [t, 1, head_dim] float32.

    ``inv_freq = theta ** (-arange(0, r, 2) / r)`` with r = ``rotary_dim`` (default ``head_dim``),
    angle = position * inv_freq, repeated twice along d (``rotate_half`` layout), as
    ``LlamaRotaryEmbedding`` computes it. With r < d (partial RoPE, GLM) the last (d - r) / 2
    frequencies are 0: those channel pairs are not rotated (cos 1, sin 0; ``slime.train.megatron.glm``).
    """
    r = head_dim if rotary_dim is None else rotary_dim
    inv_freq = 1.0 / (rope_theta ** (torch.arange(0, r, 2, dtype=torch.int64, device=position_ids.device).float() / r))
    inv_freq = torch.cat([inv_freq, inv_freq.new_zeros((head_dim - r) // 2)])
    angles = position_ids.float()[:, None] * inv_freq[None, :]  # [t, d/2]
    emb = torch.cat([angles, angles], dim=-1)[:, None, :]  # [t, 1, d]
    return emb.cos(), emb.sin()


def _apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [t, h, d] rotated as HF does it: ``x * cos + rotate_half(x) * sin``, cos/sin cast to x's dtype."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


@fused(dynamic_args=(0, 1, 2, 3))
def _rope_qk(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """``_apply_rope`` on query [t, n, d] and key [t, g, d]: one fused kernel each on CUDA."""
    return _apply_rope(query, cos, sin), _apply_rope(key, cos, sin)


@fused(dynamic_args=(0,))
def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


@fused(dynamic_args=(0,))
def _swiglu(x: Tensor) -> Tensor:
    """[..., 2 f] -> [..., f]: ``silu(gate) * up`` on the halves megatron's gated ``linear_fc1`` writes."""
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


class RMSNorm(nn.Module):
    """HF's RMSNorm: ``weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)``, built by megatron's spec.

    Args (as megatron's ``build_module`` passes them): config (``TransformerConfig``),
    hidden_size, eps. The weight gets ``sequence_parallel = config.sequence_parallel`` so
    megatron's ``finalize_model_grads`` sums its gradient over the TP group under sequence
    parallelism.
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **_: object):
        super().__init__()
        device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype, device=device))
        self.weight.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]  # megatron-core reads this flag
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return _rms_norm(x, self.weight, self.eps)


def _varlen_fn():
    """``varlen_attn`` with causal masking, or None where this torch lacks it.

    torch 2.10 spells causal ``is_causal=True``; later versions ``window_size=(-1, 0)``. Versions
    without ``enable_gqa`` get key/value heads repeated by the caller.
    """
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, False
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        causal: dict[str, Any] = dict(window_size=(-1, 0))
    elif "is_causal" in params:
        causal = dict(is_causal=True)
    else:
        return None, False
    gqa = "enable_gqa" in params

    def run(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, scale: float) -> Tensor:
        extra: dict[str, Any] = dict(enable_gqa=True) if gqa else {}
        kw: dict[str, Any] = dict(scale=scale) if "scale" in params else {}
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **causal, **kw, **extra)  # type: ignore[return-value]  # a tensor unless return_aux

    return run, gqa


_VARLEN, _VARLEN_GQA = _varlen_fn()


class SDPACoreAttention(_MegatronModule):
    """Core attention for megatron-core's ``SelfAttention``: RoPE + causal attention per packed sequence.

    Constructor arguments are the ones ``SelfAttention`` passes to any core attention
    (config, layer_number, attn_mask_type, attention_type, attention_dropout, softmax_scale,
    cp_comm_type, pg_collection); context parallelism always runs as "all_gather" and takes its
    group from the packed parameters. ``use_varlen`` (class attribute) can be set False to force
    the per-sequence SDPA path (the GPU checks compare the two); ``dense_padding_ratio``,
    ``dense_length_multiple`` and ``dense_shapes_max`` (class attributes) choose the dense path
    (module docstring; ratio 0: varlen always).
    """

    use_varlen: bool = True
    # dense cuDNN ran 1.5-2.0x varlen's speed at equal lengths (bench_kernels_h200.json); the padded copies are
    # unmeasured: pad up to 1.25x the work only
    dense_padding_ratio: float = 1.25
    dense_length_multiple: int = 128  # fewer distinct shapes, so fewer cuDNN plan builds
    dense_shapes_max: int = 64  # distinct (b, L, heads, dtype) per process; new ones past it run varlen
    _dense_shapes: ClassVar[set[tuple]] = set()
    _plans: ClassVar[dict[str, int]] = {"dense": 0, "varlen": 0}  # plans made since ``attention_path_metrics``

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ):
        super().__init__(config=config)
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> Tensor:
        """query [t, n, d], key/value [t, g, d] (megatron squeezes "thd" input) -> [t, n * d]."""
        p = packed_seq_params
        if not isinstance(p, PackedRoPEParams) or p.rope_cos is None or p.rope_sin is None:  # packing sets both tables
            raise ValueError(
                "SDPACoreAttention needs packed input with PackedRoPEParams (see slime.train.megatron.packing)"
            )
        if attention_bias is not None:
            raise ValueError("SDPACoreAttention does not take an attention bias")
        query, key = self._rotate(query, key, p)
        t, n, d = query.shape
        if p.cp_size > 1:
            return cp_attention(query, key, value, p, self.softmax_scale).reshape(t, n * d)
        fast = self.use_varlen and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16)
        if fast and (plan := self._dense_plan(p, query, key)) is not None:
            return dense_attention(query, key, value, plan[0], self.softmax_scale, plan[1]).reshape(t, n * d)
        if fast and _VARLEN is not None:
            if not _VARLEN_GQA and key.shape[1] != n:
                key = key.repeat_interleave(n // key.shape[1], dim=1)
                value = value.repeat_interleave(n // value.shape[1], dim=1)
            out = _VARLEN(query, key, value, p.cu_seqlens_q, int(p.max_seqlen_q), self.softmax_scale)
            return out.reshape(t, n * d)
        out = torch.empty_like(query)
        bounds = p.seq_bounds
        for start, end in zip(bounds[:-1], bounds[1:]):
            if end == start:
                continue
            q, k, v = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (query, key, value))  # [1, h, s, d]
            o = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=k.shape[1] != n
            )
            out[start:end] = o.squeeze(0).transpose(0, 1)
        return out.reshape(t, n * d)

    def _rotate(self, query: Tensor, key: Tensor, p: PackedRoPEParams) -> tuple[Tensor, Tensor]:
        """RoPE on query [t, n, d] and key [t, g, d] from the packed tables (``MLACoreAttention``: none, MLA did it)."""
        assert p.rope_cos is not None and p.rope_sin is not None  # forward checked both
        return _rope_qk(query, key, p.rope_cos, p.rope_sin)

    def _dense_plan(
        self, p: PackedRoPEParams, query: Tensor, key: Tensor
    ) -> tuple[tuple[int, int], Tensor | None] | None:
        """``attention_layout`` and ``dense_index`` (on the query's device) of the micro-batch, or None for varlen;
        made once for all layers. A (b, L) shape outside the process's first ``dense_shapes_max`` runs varlen."""
        rules = (self.dense_padding_ratio, self.dense_length_multiple, self.dense_shapes_max, query.device)
        if p.dense_plan is None or p.dense_plan[0] != rules:
            bounds = p.seq_bounds[:-1] if p.pad_tokens else p.seq_bounds  # the padding segment is no sequence
            layout = attention_layout(bounds, self.dense_padding_ratio, self.dense_length_multiple)
            if layout is not None:  # a shape the process has run, or room for one more (cuDNN builds a plan per shape)
                shape = (*layout, query.shape[1], key.shape[1], query.shape[2], query.dtype)
                if shape in self._dense_shapes or len(self._dense_shapes) < self.dense_shapes_max:
                    self._dense_shapes.add(shape)
                else:
                    layout = None
            index = None if layout is None else dense_index(bounds, layout[1])
            p.dense_plan = (
                rules,
                None if layout is None else (layout, None if index is None else index.to(query.device)),
            )
            self._plans["varlen" if layout is None else "dense"] += 1
        return p.dense_plan[1]

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        return {}  # no parameters


def attention_path_metrics() -> dict[str, float]:
    """``attention_dense_fraction``: of the packed micro-batches planned since the last call (each forward pass of
    each, on CUDA in half precision), the share that ran the dense padded batch; {} when none was planned (CPU)."""
    plans = SDPACoreAttention._plans
    total = plans["dense"] + plans["varlen"]
    out = {"attention_dense_fraction": plans["dense"] / total} if total else {}
    plans["dense"] = plans["varlen"] = 0
    return out


class SwiGLUMLP(_MLP):
    """megatron-core's ``MLP`` with the gated SiLU as one fused function (``_swiglu``).

    megatron's unfused path (``bias_activation_fusion=False``, needed on the CPU) chunks the
    ``linear_fc1`` output, runs ``silu``, adds ``glu_linear_offset`` (0.0: a full pass for nothing)
    and multiplies, each a pass over [t, 2 f] or [t, f], with more passes in the backward. Same
    weights, names and math; anything but plain SwiGLU (per-token scales, clamping, an offset,
    Transformer Engine activations, megatron's own fusion) goes to megatron's forward. On CUDA the
    function is ``swiglu_kernel.swiglu`` (Triton; its backward reads each input once), elsewhere or with
    ``use_triton`` (class attribute) False the compiled ``_swiglu``.
    """

    use_triton: bool = True

    def _plain_swiglu(self, per_token_scale: Tensor | None) -> bool:
        c = self.config
        return (
            per_token_scale is None
            and c.gated_linear_unit
            and self.activation_func is F.silu
            and not getattr(c, "use_te_activation_func", False)
            and not c.bias_activation_fusion
            and getattr(c, "activation_func_clamp_value", None) is None
            and getattr(c, "glu_linear_offset", 0.0) == 0.0
        )

    def forward(
        self, hidden_states: Tensor, per_token_scale: Tensor | None = None, **kwargs: Any
    ) -> tuple[Tensor, Tensor | None]:
        if not self._plain_swiglu(per_token_scale):
            return super().forward(hidden_states, per_token_scale=per_token_scale, **kwargs)
        intermediate, bias = self.linear_fc1(hidden_states)
        if bias is not None:
            intermediate = intermediate + bias
        act = (
            swiglu_kernel.swiglu
            if self.use_triton and swiglu_kernel.available(intermediate) and intermediate.is_cuda
            else _swiglu
        )
        return self.linear_fc2(act(intermediate))


class TorchGatingRouter(_TopKRouter):
    """megatron-core's ``TopKRouter`` whose gate is ``F.linear`` in the router dtype (module docstring).

    ``build_gpt_model`` turns every built ``TopKRouter`` into this class (same parameters and
    routing); only ``gating`` differs: input [s, b, hidden] -> logits [s, b, num_experts] in
    ``moe_router_dtype`` (fp32 here), the input's dtype when that is unset.
    """

    def gating(self, input: Tensor) -> Tensor:
        dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(self.config.moe_router_dtype, input.dtype)
        bias = self.bias.to(dtype) if self.bias is not None else None
        return F.linear(input.to(dtype), self.weight.to(dtype), bias)


class HiddenStatesOutput(_ColumnParallelLinear):
    """The output layer turned into a pass-through (``slime.train.megatron.model.output_hidden_states``):
    ``forward`` returns its input [s, b, h] unchanged, in the layer's ``(output, bias)`` form, so
    GPTModel returns the final hidden states; the weight stays a parameter of the layer."""

    def forward(
        self, input_: Tensor, weight: Tensor | None = None, runtime_gather_output: bool | None = None
    ) -> tuple[Tensor, None]:
        return input_, None
