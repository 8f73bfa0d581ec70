"""GLM-4's sandwich norms on megatron-core's layers: an RMSNorm on the attention output and one on the MLP output.

HF's ``Glm4DecoderLayer``::

    h = x + post_self_attn_layernorm(attn(input_layernorm(x)))
    y = h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))

megatron-core's ``TransformerLayer`` (0.16) has the two pre-norms only. ``add_post_norms`` gives each
layer's ``self_attention`` and ``mlp`` a ``post_layernorm`` (slime's HF-exact ``RMSNorm``) that a forward
hook applies to the module's output, before megatron's bias-dropout-add adds the residual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from slime.train.megatron._mcore import mcore
from slime.train.megatron.layers import RMSNorm

if TYPE_CHECKING:  # megatron-core ships no type information
    from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["add_post_norms"]


def _post_norm_hook(module: torch.nn.Module, _args: object, output: tuple[Tensor, Tensor | None]) -> tuple:
    """The attention's / MLP's ``(output, bias)`` with ``module.post_layernorm`` applied to the output.

    Raises:
        ValueError: the module returned a bias (the norm would have to see output + bias first).
    """
    hidden, bias = output
    if bias is not None:
        raise ValueError("GLM post-norms need add_bias_linear=False")
    norm: RMSNorm = module.post_layernorm  # type: ignore[assignment]  # set by add_post_norms
    return norm(hidden), None


def add_post_norms(model: torch.nn.Module, config: TransformerConfig) -> None:
    """Give every ``TransformerLayer`` of ``model`` (one pipeline stage) the two post-norms (module docstring).

    Their weights are ``decoder.layers.i.self_attention.post_layernorm.weight`` and
    ``decoder.layers.i.mlp.post_layernorm.weight`` [hidden] (ones until loaded; replicated over TP, marked
    for the sequence-parallel gradient sum as every RMSNorm). A forward hook rather than a layer subclass:
    megatron-core's ``TransformerLayer.forward`` (recompute, sequence parallel, bias-dropout-add) stays its
    own, and the hook runs inside it wherever the module runs, recomputed passes included.
    """
    layer_class = mcore("megatron.core.transformer.transformer_layer").TransformerLayer
    for layer in model.modules():
        if not isinstance(layer, layer_class):
            continue
        for part in (layer.self_attention, layer.mlp):
            part.post_layernorm = RMSNorm(config, config.hidden_size, config.layernorm_epsilon)
            part.register_forward_hook(_post_norm_hook)
