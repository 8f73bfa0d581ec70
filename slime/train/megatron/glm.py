"""What GLM-4 (``Glm4ForCausalLM``) and GLM-4.5 to 4.7 (``Glm4MoeForCausalLM``) add to the megatron backend.

Three things differ from the Llama layout the converter and the layer spec speak:

1. **Partial and interleaved RoPE.** GLM rotates only the first ``rotary_dim = head_dim *
   partial_rotary_factor`` channels of each query/key head (0.5 in the released checkpoints);
   GLM-4 rotates adjacent pairs ``(2j, 2j + 1)`` by frequency j (interleaved), GLM-4.5 the halves
   ``(j, j + rotary_dim / 2)``. slime's attention rotates pairs ``(c, c + head_dim / 2)``
   (``layers._apply_rope``). Attention scores ``q . k`` do not change when the channels of every
   query and key head are permuted the same way, so the conversion permutes them
   (``rope_permutation``): megatron channel c < head_dim / 2 holds the first channel of pair c and
   channel ``c + head_dim / 2`` its partner; the channels RoPE leaves alone fill the pairs after the
   rotary ones, whose frequency is 0 (``layers.rope_cos_sin(rotary_dim=...)``: cos 1, sin 0, the
   identity). The q/k biases and q/k norm weights are permuted with their rows; values and the
   output projection are not touched. Example: head_dim 8, rotary_dim 4, interleaved -> megatron
   channels hold HF channels ``[0, 2, 4, 5, 1, 3, 6, 7]`` (pairs (0,1), (2,3) rotate, (4,6), (5,7)
   at frequency 0).
2. **GLM-4's fused MLP input**: one ``mlp.gate_up_proj.weight`` [2 f, hidden] on disk (gate rows
   first) where the converter reads ``gate_proj`` and ``up_proj``.
3. **GLM-4's sandwich norms**: ``post_self_attn_layernorm`` on the attention output and
   ``post_mlp_layernorm`` on the MLP output, each before its residual add. megatron-core's
   ``TransformerLayer`` has no such norm; ``slime.train.megatron.post_norms`` adds them to the
   built model (this module is pure tensor code, as ``convert`` is).

``checkpoint_getter`` presents the on-disk tensors under the converter's names and layout;
``to_checkpoint`` turns the converter's output back (bit-exact: only permutes, slices and concatenates).
GLM-4.5's MoE layers are DeepSeek-V3's (``slime.train.megatron.deepseek_moe``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from slime.train.megatron.arch import ModelArch

__all__ = ["GLM_MODEL_TYPES", "rope_permutation", "checkpoint_getter", "to_checkpoint"]

GLM_MODEL_TYPES = ("glm4", "glm4_moe")
_ROTATED = ("self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "self_attn.k_proj.bias")
_HEAD_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


def rope_permutation(head_dim: int, rotary_dim: int, interleaved: bool) -> Tensor | None:
    """[head_dim] int64: the HF channel megatron channel c holds (module docstring, 1.); None for the identity.

    Raises:
        ValueError: an odd ``rotary_dim`` or ``head_dim - rotary_dim``, or ``rotary_dim`` > ``head_dim``.
    """
    rest = head_dim - rotary_dim
    if rotary_dim % 2 or rest % 2 or rest < 0:
        raise ValueError(
            f"rotary_dim={rotary_dim} with head_dim={head_dim}: expected even sizes, rotary_dim <= head_dim"
        )
    half = rotary_dim // 2
    if interleaved:
        first, second = list(range(0, rotary_dim, 2)), list(range(1, rotary_dim, 2))
    else:
        first, second = list(range(half)), list(range(half, rotary_dim))
    passed = list(range(rotary_dim, head_dim))
    perm = first + passed[: rest // 2] + second + passed[rest // 2 :]
    return None if perm == list(range(head_dim)) else torch.tensor(perm)


def _arch_permutation(arch: ModelArch) -> Tensor | None:
    return rope_permutation(arch.head_dim, arch.rotary_dim or arch.head_dim, arch.rope_interleaved)


def _permute_heads(t: Tensor, perm: Tensor, head_dim: int) -> Tensor:
    """Rows of ``t`` ([heads * d, ...] projection or bias, or a [d] head norm) reordered within each head by ``perm``."""
    return t.reshape(-1, head_dim, *t.shape[1:])[:, perm].reshape(t.shape).clone()


def checkpoint_getter(get: Callable[[str], Tensor], arch: ModelArch) -> Callable[[str], Tensor]:
    """``get`` (HF tensors by on-disk name) seen with the converter's names and channel order (module docstring)."""
    perm = _arch_permutation(arch)
    fused_mlp = arch.family == "glm4"
    if perm is None and not fused_mlp:
        return get

    def read(name: str) -> Tensor:
        if fused_mlp and name.endswith((".mlp.gate_proj.weight", ".mlp.up_proj.weight")):
            prefix, proj = name.rsplit(".", 2)[0], name.rsplit(".", 2)[1]
            return get(prefix + ".gate_up_proj.weight").chunk(2, dim=0)[proj == "up_proj"].clone()
        if perm is not None and name.endswith(_ROTATED + _HEAD_NORMS):
            return _permute_heads(get(name), perm, arch.head_dim)
        return get(name)

    return read


def to_checkpoint(tensors: Mapping[str, Tensor], arch: ModelArch) -> dict[str, Tensor]:
    """The converter's HF tensors of one megatron parameter under their on-disk names and layout.

    Inverse of ``checkpoint_getter``: q/k rows back to HF's channel order, GLM-4's ``gate_proj`` and
    ``up_proj`` (which arrive together, from one ``linear_fc1``) fused into ``gate_up_proj``.
    """
    perm = _arch_permutation(arch)
    out = dict(tensors)
    if perm is not None:
        inverse = torch.argsort(perm)
        for name in out:
            if name.endswith(_ROTATED + _HEAD_NORMS):
                out[name] = _permute_heads(out[name], inverse, arch.head_dim)
    if arch.family == "glm4":
        for gate in [n for n in out if n.endswith(".mlp.gate_proj.weight")]:
            prefix = gate[: -len("gate_proj.weight")]
            out[prefix + "gate_up_proj.weight"] = torch.cat([out.pop(gate), out.pop(prefix + "up_proj.weight")])
    return out
