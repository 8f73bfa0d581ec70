"""HF <-> megatron-core weight conversion for the dense decoders of ``arch.py``: pure tensor code.

No process group is needed: ``hf_to_mcore`` builds the state dict of one tensor-parallel rank,
``mcore_to_hf`` takes the state dicts of all TP ranks and gathers them. Both only slice, pad and
concatenate, so a round trip is bit-exact in any dtype.

Names (layer ``i``; megatron-core's local layer spec, ``slime.train.megatron.model``)::

    model.embed_tokens.weight                 embedding.word_embeddings.weight        vocab rows split
    model.layers.i.input_layernorm.weight     decoder.layers.i.input_layernorm.weight replicated
    model.layers.i.self_attn.{q,k,v}_proj.*   decoder.layers.i.self_attention.linear_qkv.{weight,bias}
    model.layers.i.self_attn.{q,k}_norm.weight  ...self_attention.{q,k}_layernorm.weight  replicated (Qwen3)
    model.layers.i.self_attn.o_proj.weight    ...self_attention.linear_proj.weight    input dim split (row-parallel)
    model.layers.i.post_attention_layernorm.weight  decoder.layers.i.pre_mlp_layernorm.weight
    model.layers.i.mlp.{gate,up}_proj.weight  ...mlp.linear_fc1.weight                 fused, output dim split
    model.layers.i.mlp.down_proj.weight       ...mlp.linear_fc2.weight                 input dim split
    model.norm.weight                         decoder.final_layernorm.weight
    lm_head.weight                            output_layer.weight (absent when tied)   vocab rows split

QKV layout (megatron's): output rows are grouped by key/value head. With g = num_query_groups,
p = heads per group, d = head_dim, the fused weight is ``[g, (p + 2) * d, hidden]``: each group's p
query heads, then its key head, then its value head. Column-parallel rank r holds rows
``[r * R, (r + 1) * R)`` of the flattened ``[g * (p + 2) * d, hidden]``. Example: g=2, p=2, TP=2 ->
rank 0 holds ``q0 q1 k0 v0``, rank 1 ``q2 q3 k1 v1``. When g < TP (megatron replicates no weight
there either) a rank's rows are part of one group; megatron's attention gathers them back.

SwiGLU (fc1): megatron's GLU chunks each rank's fc1 output in two halves, ``silu(first) * second``,
so rank r holds ``[gate_r; up_r]``: its slice of gate_proj stacked on its slice of up_proj.

Vocabulary: rows are zero-padded to ``arch.padded_vocab_size(tp)`` and split evenly; ``mcore_to_hf``
drops the padding again.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor

from slime.train.megatron.arch import ModelArch

__all__ = ["hf_to_mcore", "mcore_to_hf", "iter_mcore_to_hf", "mcore_names", "hf_names_for", "is_tensor_parallel", "mcore_param_to_hf", "hf_to_mcore_param"]

HfGetter = Callable[[str], Tensor]
"""Returns one HF tensor by name (a dict's ``__getitem__``, or a lazy safetensors read)."""


def _layer_names(arch: ModelArch, i: int) -> list[str]:
    pre = f"decoder.layers.{i}."
    names = [pre + "input_layernorm.weight", pre + "self_attention.linear_qkv.weight"]
    if arch.qkv_bias:
        names.append(pre + "self_attention.linear_qkv.bias")
    if arch.qk_norm:
        names += [pre + "self_attention.q_layernorm.weight", pre + "self_attention.k_layernorm.weight"]
    names += [pre + "self_attention.linear_proj.weight", pre + "pre_mlp_layernorm.weight", pre + "mlp.linear_fc1.weight", pre + "mlp.linear_fc2.weight"]
    return names


def mcore_names(arch: ModelArch) -> list[str]:
    """Every megatron-core parameter name of the model (pipeline size 1), in model order."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(arch.num_layers):
        names += _layer_names(arch, i)
    names.append("decoder.final_layernorm.weight")
    if not arch.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


_LAYER_MAP = {
    "input_layernorm.weight": ("input_layernorm.weight",),
    "self_attention.linear_qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "self_attention.linear_qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "self_attention.q_layernorm.weight": ("self_attn.q_norm.weight",),
    "self_attention.k_layernorm.weight": ("self_attn.k_norm.weight",),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight",),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight",),
    "mlp.linear_fc1.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight",),
}
_TOP_MAP = {
    "embedding.word_embeddings.weight": ("model.embed_tokens.weight",),
    "decoder.final_layernorm.weight": ("model.norm.weight",),
    "output_layer.weight": ("lm_head.weight",),
}


def _split_name(name: str) -> tuple[int | None, str]:
    """``decoder.layers.3.mlp.linear_fc1.weight`` -> (3, ``mlp.linear_fc1.weight``); top-level -> (None, name)."""
    if name.startswith("decoder.layers."):
        idx, rest = name[len("decoder.layers.") :].split(".", 1)
        return int(idx), rest
    return None, name


def hf_names_for(name: str) -> tuple[str, ...]:
    """The HF tensors that make up megatron parameter ``name``, in fusion order."""
    layer, rest = _split_name(name)
    if layer is None:
        if rest not in _TOP_MAP:
            raise KeyError(f"no HF counterpart for megatron parameter {name!r}")
        return _TOP_MAP[rest]
    if rest not in _LAYER_MAP:
        raise KeyError(f"no HF counterpart for megatron parameter {name!r}")
    return tuple(f"model.layers.{layer}.{hf}" for hf in _LAYER_MAP[rest])


def _kind(rest: str) -> str:
    if rest in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return "vocab"
    if rest.startswith("self_attention.linear_qkv."):
        return "qkv"
    if rest == "mlp.linear_fc1.weight":
        return "fc1"
    if rest in ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight"):
        return "row"
    return "replicated"


def is_tensor_parallel(name: str) -> bool:
    """Whether megatron parameter ``name`` is split over TP ranks (norm weights are replicated)."""
    return _kind(_split_name(name)[1]) != "replicated"


def hf_to_mcore_param(name: str, get: HfGetter, arch: ModelArch, *, tp_size: int = 1, tp_rank: int = 0) -> Tensor:
    """Megatron parameter ``name`` of TP rank ``tp_rank``, built from the HF tensors ``get`` returns.

    Args:
        name: a name from ``mcore_names(arch)``.
        get: HF tensor by name; ``lm_head.weight`` of a tied model is never asked for.
        arch: the model.
        tp_size / tp_rank: tensor-parallel world size and this rank.

    Returns:
        A new contiguous tensor in the HF dtype (never a view of an HF tensor).
    """
    _, rest = _split_name(name)
    hf = [get(n) for n in hf_names_for(name)]
    kind = _kind(rest)
    if kind == "vocab":
        (w,) = hf
        padded = arch.padded_vocab_size(tp_size)
        if padded != w.shape[0]:
            w = torch.cat([w, w.new_zeros((padded - w.shape[0], *w.shape[1:]))])
        return w.chunk(tp_size, dim=0)[tp_rank].clone()
    if kind == "qkv":
        q, k, v = hf
        g, p, d = arch.num_query_groups, arch.heads_per_group, arch.head_dim
        tail = q.shape[1:]  # (hidden,) for weights, () for biases
        fused = torch.cat([q.reshape(g, p * d, *tail), k.reshape(g, d, *tail), v.reshape(g, d, *tail)], dim=1)
        return fused.reshape(g * (p + 2) * d, *tail).chunk(tp_size, dim=0)[tp_rank].clone()
    if kind == "fc1":
        gate, up = hf
        return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]], dim=0)
    if kind == "row":
        (w,) = hf
        return w.chunk(tp_size, dim=1)[tp_rank].clone()
    (w,) = hf
    return w.clone()


def mcore_param_to_hf(name: str, shards: Sequence[Tensor], arch: ModelArch) -> dict[str, Tensor]:
    """Gather megatron parameter ``name`` from its TP shards (rank order) into HF tensors.

    Args:
        name: a name from ``mcore_names(arch)``.
        shards: one tensor per TP rank; for replicated parameters rank 0's is used.
        arch: the model.

    Returns:
        ``{hf_name: tensor}``: one entry, two (gate/up) or three (q/k/v).
    """
    hf_names = hf_names_for(name)
    _, rest = _split_name(name)
    kind = _kind(rest)
    if kind == "replicated":
        return {hf_names[0]: shards[0].clone()}
    if kind == "row":
        return {hf_names[0]: torch.cat(list(shards), dim=1)}
    if kind == "vocab":
        return {hf_names[0]: torch.cat(list(shards), dim=0)[: arch.vocab_size].clone()}
    if kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return {hf_names[0]: torch.cat([h[0] for h in halves]), hf_names[1]: torch.cat([h[1] for h in halves])}
    g, p, d = arch.num_query_groups, arch.heads_per_group, arch.head_dim
    full = torch.cat(list(shards), dim=0)
    tail = full.shape[1:]
    q, k, v = full.reshape(g, (p + 2) * d, *tail).split([p * d, d, d], dim=1)
    return {
        hf_names[0]: q.reshape(g * p * d, *tail).clone(),
        hf_names[1]: k.reshape(g * d, *tail).clone(),
        hf_names[2]: v.reshape(g * d, *tail).clone(),
    }


def hf_to_mcore(hf_state: Mapping[str, Tensor], arch: ModelArch, *, tp_size: int = 1, tp_rank: int = 0) -> dict[str, Tensor]:
    """The full megatron-core state dict of one TP rank (``mcore_names`` order)."""
    return {name: hf_to_mcore_param(name, hf_state.__getitem__, arch, tp_size=tp_size, tp_rank=tp_rank) for name in mcore_names(arch)}


def iter_mcore_to_hf(shard_states: Sequence[Mapping[str, Tensor]], arch: ModelArch) -> Iterator[tuple[str, Tensor]]:
    """HF tensors one megatron parameter at a time, from every TP rank's state dict."""
    for name in mcore_names(arch):
        yield from mcore_param_to_hf(name, [s[name] for s in shard_states], arch).items()


def mcore_to_hf(shard_states: Sequence[Mapping[str, Tensor]], arch: ModelArch) -> dict[str, Tensor]:
    """Gather the state dicts of all TP ranks (rank order) into one HF state dict.

    A tied model gets no ``lm_head.weight`` (HF ties it on load).
    """
    if not shard_states:
        raise ValueError("mcore_to_hf: no shard state dicts given")
    return dict(iter_mcore_to_hf(shard_states, arch))
