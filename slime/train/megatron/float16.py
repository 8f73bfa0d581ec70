"""megatron's ``Float16Module`` wrap (``--bf16``) without the rounding of the MoE routers' fp32 buffers.

Source: megatron-core's ``TopKRouter`` registers ``expert_bias`` and ``local_tokens_per_expert`` as fp32
buffers and casts the bias back to fp32 on each forward (``_maintain_float32_expert_bias``); the wrap's
``module.bfloat16()`` has rounded it by then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from slime.train.megatron._mcore import mcore

if TYPE_CHECKING:  # megatron-core ships no type information (mypy reads it as Any)
    from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["wrap_float16"]


def wrap_float16(model: torch.nn.Module, config: TransformerConfig) -> torch.nn.Module:
    """megatron's ``Float16Module`` around ``model``, with the MoE routers' buffers kept fp32, value for value.

    The wrap casts every buffer to bf16. megatron's router casts its ``expert_bias`` back to fp32 on its first
    forward, but the digits are lost by then: the trainer would route with another bias than the checkpoint
    holds (HF keeps ``e_score_correction_bias`` in fp32) and sync that rounded bias to the engines; and
    ``local_tokens_per_expert`` would count tokens in bf16 (exact only up to 256), flipping the sign of the
    bias update of an expert near the mean. Example: a bias of 0.1234567 stays 0.1234567, not 0.1235352.
    """
    router_class = mcore("megatron.core.transformer.moe.router").TopKRouter
    kept = {
        (router, name): buf.detach().clone()
        for router in model.modules()
        if isinstance(router, router_class)
        for name, buf in router.named_buffers(recurse=False)
        if buf is not None and buf.dtype == torch.float32
    }
    wrapped = mcore("megatron.core.transformer.module").Float16Module(config, model)
    for (router, name), value in kept.items():
        getattr(router, name).data = value
    return wrapped
