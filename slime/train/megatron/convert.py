"""HF <-> megatron-core weight conversion for the decoders of ``arch.py``: pure tensor code.

No process group is needed: ``hf_to_mcore`` builds the state dict of one rank (its tensor-parallel
rank, and for MoE models its expert-parallel and expert-tensor-parallel ranks), ``mcore_to_hf``
takes the state dicts of all TP ranks (and of all EP x ETP ranks for the experts) and gathers
them. Both only slice, pad and concatenate, so a round trip is bit-exact in any dtype.

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

MoE layers (Qwen3-MoE, Qwen2-MoE; ``E`` experts, EP ranks, ``E / EP`` local experts each)::

    model.layers.i.mlp.gate.weight                   decoder.layers.i.mlp.router.weight   [E, hidden] replicated
    model.layers.i.mlp.experts.e.{gate,up}_proj.weight
                                  decoder.layers.i.mlp.experts.local_experts.j.linear_fc1.weight
    model.layers.i.mlp.experts.e.down_proj.weight    ...experts.local_experts.j.linear_fc2.weight
    model.layers.i.mlp.shared_expert.{gate,up}_proj.weight  ...mlp.shared_experts.linear_fc1.weight (TP split)
    model.layers.i.mlp.shared_expert.down_proj.weight       ...mlp.shared_experts.linear_fc2.weight
    model.layers.i.mlp.shared_expert_gate.weight     ...mlp.shared_experts.gate_weight    [1, hidden] replicated

Expert ``e`` lives on EP rank ``e // (E / EP)`` as local expert ``j = e % (E / EP)``; inside an
expert, fc1/fc2 split over the expert-tensor-parallel (ETP) ranks exactly as a dense MLP splits
over TP. Example: E=4, EP=2, ETP=1 -> EP rank 1 holds experts 2 and 3 as local experts 0 and 1.
The names are HF's on-disk ones (one tensor per expert and projection), which transformers 5 also
writes; its in-memory fused ``experts.gate_up_proj`` is not used here.

Vocabulary: rows are zero-padded to ``arch.padded_vocab_size(tp)`` and split evenly; ``mcore_to_hf``
drops the padding again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypedDict

import torch
from torch import Tensor

from slime.train.megatron.arch import ModelArch
from slime.train.megatron.deepseek import DEEPSEEK_MOE_HF_NAMES, DEEPSEEK_V3_HF_NAMES, mla_param_names
from slime.train.megatron.glm import checkpoint_getter, to_checkpoint

__all__ = [
    "mcore_names", "hf_names_for", "is_tensor_parallel", "is_expert",
    "mcore_param_to_hf", "hf_to_mcore_param", "pipeline_stage", "stage_names", "Ranks",
]  # fmt: skip

HfGetter = Callable[[str], Tensor]
"""Returns one HF tensor by name (a dict's ``__getitem__``, or a lazy safetensors read)."""


def _layer_names(arch: ModelArch, i: int, ep_size: int) -> list[str]:
    pre = f"decoder.layers.{i}."
    names = [pre + "input_layernorm.weight"]
    names += mla_param_names(arch.mla, pre) if arch.mla else [pre + "self_attention.linear_qkv.weight"]
    if arch.qkv_bias:
        names.append(pre + "self_attention.linear_qkv.bias")
    if arch.qk_norm:
        names += [pre + "self_attention.q_layernorm.weight", pre + "self_attention.k_layernorm.weight"]
    names.append(pre + "self_attention.linear_proj.weight")
    if arch.post_norms:  # GLM-4 (slime.train.megatron.post_norms)
        names.append(pre + "self_attention.post_layernorm.weight")
    names.append(pre + "pre_mlp_layernorm.weight")
    if not (arch.moe_layers and arch.moe_layers[i]):
        post = [pre + "mlp.post_layernorm.weight"] if arch.post_norms else []
        return names + [pre + "mlp.linear_fc1.weight", pre + "mlp.linear_fc2.weight", *post]
    names.append(pre + "mlp.router.weight")
    names += (
        [pre + "mlp.router.expert_bias"] if arch.router and arch.router.expert_bias else []
    )  # a buffer (deepseek_moe)
    for j in range(arch.num_experts // ep_size):
        names += [
            pre + f"mlp.experts.local_experts.{j}.linear_fc1.weight",
            pre + f"mlp.experts.local_experts.{j}.linear_fc2.weight",
        ]
    if arch.shared_expert_ffn_hidden_size:
        names += [pre + "mlp.shared_experts.linear_fc1.weight", pre + "mlp.shared_experts.linear_fc2.weight"]
        if arch.shared_expert_gate:
            names.append(pre + "mlp.shared_experts.gate_weight")
    return names


def mcore_names(arch: ModelArch, *, ep_size: int = 1) -> list[str]:
    """Every megatron-core parameter name of one rank's model (pipeline size 1), in model order.

    Args:
        ep_size: expert-parallel size; each MoE layer names its ``num_experts / ep_size`` local experts.
    """
    names = ["embedding.word_embeddings.weight"]
    for i in range(arch.num_layers):
        names += _layer_names(arch, i, ep_size)
    names.append("decoder.final_layernorm.weight")
    if not arch.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


def pipeline_stage(name: str, arch: ModelArch, pp_size: int) -> int:
    """The pipeline stage holding ``name`` (an ``mcore_names`` name, global layer index): the
    embedding on stage 0, the final norm and output layer on the last one, layer i on stage
    ``i // (num_layers / pp_size)`` (megatron-core's even split)."""
    layer, _ = _split_name(name)
    if layer is not None:
        return layer // (arch.num_layers // pp_size)
    return 0 if name.startswith("embedding.") else pp_size - 1


def stage_names(arch: ModelArch, *, pp_size: int = 1, pp_rank: int = 0, ep_size: int = 1) -> dict[str, str]:
    """One pipeline stage's parameters: its model's (local) name -> the ``mcore_names`` (global) name.

    A stage numbers its layers from 0 (``decoder.layers.0`` of stage s is global layer
    ``s * num_layers / pp_size``). With tied embeddings the last stage of a pipeline holds its own
    ``output_layer.weight``, a copy of the embedding (megatron sums the two gradients), mapped
    here to ``embedding.word_embeddings.weight``.
    """
    per_stage = arch.num_layers // pp_size
    out = {}
    for name in mcore_names(arch, ep_size=ep_size):
        if pipeline_stage(name, arch, pp_size) != pp_rank:
            continue
        layer, rest = _split_name(name)
        out[name if layer is None else f"decoder.layers.{layer - pp_rank * per_stage}.{rest}"] = name
    if pp_size > 1 and arch.tie_word_embeddings and pp_rank == pp_size - 1:
        out["output_layer.weight"] = "embedding.word_embeddings.weight"
    return out


_LAYER_MAP = {
    "input_layernorm.weight": ("input_layernorm.weight",),
    "self_attention.linear_qkv.weight": (
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
    ),
    "self_attention.linear_qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    "self_attention.q_layernorm.weight": ("self_attn.q_norm.weight",),
    "self_attention.k_layernorm.weight": ("self_attn.k_norm.weight",),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight",),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight",),
    "self_attention.post_layernorm.weight": ("post_self_attn_layernorm.weight",),  # GLM-4
    "mlp.post_layernorm.weight": ("post_mlp_layernorm.weight",),
    "mlp.linear_fc1.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight",),
    "mlp.router.weight": ("mlp.gate.weight",),
    "mlp.shared_experts.linear_fc1.weight": ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"),
    "mlp.shared_experts.linear_fc2.weight": ("mlp.shared_expert.down_proj.weight",),
    "mlp.shared_experts.gate_weight": ("mlp.shared_expert_gate.weight",),
}
_EXPERT_PREFIX = "mlp.experts.local_experts."
_EXPERT_MAP = {
    "linear_fc1.weight": ("gate_proj.weight", "up_proj.weight"),
    "linear_fc2.weight": ("down_proj.weight",),
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


def _expert_parts(rest: str) -> tuple[int, str] | None:
    """``mlp.experts.local_experts.3.linear_fc1.weight`` -> (3, ``linear_fc1.weight``); None otherwise."""
    if not rest.startswith(_EXPERT_PREFIX):
        return None
    j, tail = rest[len(_EXPERT_PREFIX) :].split(".", 1)
    return int(j), tail


def is_expert(name: str) -> bool:
    """Whether megatron parameter ``name`` is a routed expert's (split over EP, and over ETP inside)."""
    return _expert_parts(_split_name(name)[1]) is not None


_FAMILY_LAYER_MAPS: dict[str, Mapping[str, tuple[str, ...]]] = {  # over _LAYER_MAP
    "deepseek_v3": DEEPSEEK_V3_HF_NAMES,
    "glm4_moe": DEEPSEEK_MOE_HF_NAMES,  # GLM-4.5's MoE names are DeepSeek-V3's
    "glm4_moe_lite": DEEPSEEK_V3_HF_NAMES,  # GLM-4.7-Flash's layers are DeepSeek-V3's (slime.train.megatron.glm_lite)
}


def hf_names_for(name: str, *, expert_offset: int = 0, family: str = "") -> tuple[str, ...]:
    """The HF tensors that make up megatron parameter ``name``, in fusion order.

    Args:
        expert_offset: global index of this rank's local expert 0 (``ep_rank * num_experts / ep_size``).
        family: the model's ``ModelArch.family`` (DeepSeek-V3 names MLA and its shared experts its own way).
    """
    layer, rest = _split_name(name)
    expert = _expert_parts(rest)
    if expert is not None:
        j, tail = expert
        if tail not in _EXPERT_MAP:
            raise KeyError(f"no HF counterpart for megatron parameter {name!r}")
        return tuple(f"model.layers.{layer}.mlp.experts.{expert_offset + j}.{hf}" for hf in _EXPERT_MAP[tail])
    if layer is None:
        if rest not in _TOP_MAP:
            raise KeyError(f"no HF counterpart for megatron parameter {name!r}")
        return _TOP_MAP[rest]
    table = {**_LAYER_MAP, **_FAMILY_LAYER_MAPS.get(family, {})}
    if rest not in table:
        raise KeyError(f"no HF counterpart for megatron parameter {name!r}")
    return tuple(f"model.layers.{layer}.{hf}" for hf in table[rest])


def _kind(rest: str) -> str:
    if rest in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return "vocab"
    if rest.startswith("self_attention.linear_qkv."):
        return "qkv"
    if rest.endswith("linear_fc1.weight"):  # dense MLP, shared expert, routed expert
        return "fc1"
    if rest == "self_attention.linear_proj.weight" or rest.endswith("linear_fc2.weight"):
        return "row"
    if rest.startswith(("self_attention.linear_q_", "self_attention.linear_kv_")):  # MLA: plain column-parallel
        return "column"
    return "replicated"  # norms, router (and its expert bias), shared-expert gate


def is_tensor_parallel(name: str) -> bool:
    """Whether megatron parameter ``name`` is split over TP ranks (norm weights are replicated)."""
    return _kind(_split_name(name)[1]) != "replicated"


class Ranks(TypedDict):
    """The parallel ranks keyword arguments of ``hf_to_mcore_param``."""

    tp_size: int
    tp_rank: int
    ep_size: int
    ep_rank: int
    etp_size: int | None
    etp_rank: int | None


def hf_to_mcore_param(
    name: str, get: HfGetter, arch: ModelArch, *, tp_size: int = 1, tp_rank: int = 0,
    ep_size: int = 1, ep_rank: int = 0, etp_size: int | None = None, etp_rank: int | None = None,
) -> Tensor:  # fmt: skip
    """Megatron parameter ``name`` of one rank, built from the HF tensors ``get`` returns.

    Args:
        name: a name from ``mcore_names(arch, ep_size=ep_size)``.
        get: HF tensor by name; ``lm_head.weight`` of a tied model is never asked for.
        arch: the model.
        tp_size / tp_rank: tensor-parallel world size and this rank.
        ep_size / ep_rank: expert-parallel size and rank (routed experts only).
        etp_size / etp_rank: expert-tensor-parallel size and rank (routed experts only);
            None = ``tp_size`` / ``tp_rank``.

    Returns:
        A new contiguous tensor in the HF dtype (never a view of an HF tensor).
    """
    get = checkpoint_getter(get, arch)  # GLM's on-disk layout seen as Llama's (slime.train.megatron.glm)
    _, rest = _split_name(name)
    if _expert_parts(rest) is not None:
        tp_size = tp_size if etp_size is None else etp_size
        tp_rank = tp_rank if etp_rank is None else etp_rank
        offset = ep_rank * (arch.num_experts // ep_size)
        hf = [get(n) for n in hf_names_for(name, expert_offset=offset, family=arch.family)]
    else:
        hf = [get(n) for n in hf_names_for(name, family=arch.family)]
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
    if kind in ("row", "column"):
        (w,) = hf
        return w.chunk(tp_size, dim=1 if kind == "row" else 0)[tp_rank].clone()
    (w,) = hf
    return w.clone()


def mcore_param_to_hf(
    name: str, shards: Sequence[Tensor], arch: ModelArch, *, ep_size: int = 1, ep_rank: int = 0
) -> dict[str, Tensor]:
    """Gather megatron parameter ``name`` from its TP shards (rank order) into HF tensors.

    Args:
        name: a name from ``mcore_names(arch, ep_size=ep_size)``.
        shards: one tensor per TP rank (per ETP rank for a routed expert's weights); for
            replicated parameters rank 0's is used.
        arch: the model.
        ep_size / ep_rank: for a routed expert's weights, the EP rank they come from (its local
            expert j is global expert ``ep_rank * num_experts / ep_size + j``).

    Returns:
        ``{hf_name: tensor}``: one entry, two (gate/up; GLM-4's dense MLP: one fused) or three (q/k/v).
    """
    return to_checkpoint(_gather_to_hf(name, shards, arch, ep_size=ep_size, ep_rank=ep_rank), arch)


def _gather_to_hf(
    name: str, shards: Sequence[Tensor], arch: ModelArch, *, ep_size: int, ep_rank: int
) -> dict[str, Tensor]:
    """``mcore_param_to_hf`` in the Llama layout (before ``glm.to_checkpoint``)."""
    offset = ep_rank * (arch.num_experts // ep_size) if is_expert(name) else 0
    hf_names = hf_names_for(name, expert_offset=offset, family=arch.family)
    _, rest = _split_name(name)
    kind = _kind(rest)
    if kind == "replicated":
        return {hf_names[0]: shards[0].clone()}
    if kind in ("row", "column"):
        return {hf_names[0]: torch.cat(list(shards), dim=1 if kind == "row" else 0)}
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
