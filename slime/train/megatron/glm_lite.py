"""GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``, HF ``model_type`` "glm4_moe_lite") from its HF config.

transformers' ``Glm4MoeLite`` is DeepSeek-V3 under another name: its attention is ``DeepseekV3Attention``
(multi-latent attention, interleaved RoPE, YaRN's softmax scale), its router, experts, shared experts, MLP and
RMSNorm are GLM-4.5's, which are DeepSeek-V3's line for line (checked against transformers 5.24's modular
file). So the fields are ``deepseek.deepseek_v3_fields``' (with this module's layer list), the weight names
``DEEPSEEK_V3_HF_NAMES``, the megatron modules ``mla``'s and ``deepseek_moe``'s. Three things differ, read here:

1. **Which layers are dense.** transformers builds layer i as an MoE layer when ``mlp_layer_types[i] ==
   "sparse"`` (default: layer 0 dense, the others MoE) and ignores ``first_k_dense_replace``; SGLang 0.5.17's
   ``Glm4MoeLiteForCausalLM`` reads ``first_k_dense_replace`` (and ``moe_layer_freq``) instead. The pattern is
   ``mlp_layer_types``; a config whose ``first_k_dense_replace`` says otherwise is refused (the trainer, the
   embedded engine and SGLang would run three different models). Example: 47 layers, no ``mlp_layer_types``,
   ``first_k_dense_replace=1`` (GLM-4.7-Flash) -> layer 0 dense, layers 1..46 MoE.
2. **RoPE width.** GLM-4.5's rotary embedding rotates ``qk_rope_head_dim * partial_rotary_factor`` channels; under
   the interleaved rotation a factor below 1 broadcasts the first frequencies over all rope channels, which no
   megatron option computes: refused. 1.0 (GLM-4.7-Flash's) is DeepSeek-V3's RoPE.
3. **Multi-token prediction**: the checkpoint's ``num_nextn_predict_layers`` layers after ``num_hidden_layers``
   (transformers skips ``model.layers.47.*``) are not read, as for DeepSeek-V3 (one log line).

The released defaults differ from DeepSeek-V3's (``rms_norm_eps`` 1e-5, one expert group, ``routed_scaling_factor``
1.8, ``v_head_dim`` = ``qk_nope_head_dim + qk_rope_head_dim`` = 256), nothing in the layers. The q / kv latent
norms keep transformers' fixed 1e-6 (``mla.LatentRMSNorm``) while the other norms use ``rms_norm_eps``.
Pure config code (no megatron import), as ``deepseek``; ``arch`` composes the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["GLM4_MOE_LITE", "HFConfig", "glm4_moe_lite_layers"]

GLM4_MOE_LITE = "glm4_moe_lite"
HFConfig = Mapping[str, Any]
"""An HF ``config.json`` as parsed JSON (any JSON value under a key)."""


class _Unsupported(ValueError):
    """A GLM-4.7-Flash option megatron-core does not compute; ``arch`` re-raises it as UnsupportedArchitecture."""


def glm4_moe_lite_layers(config: HFConfig) -> tuple[bool, ...]:
    """Per layer, whether transformers builds it as an MoE layer (module docstring, 1.), after checking the RoPE width.

    ``arch`` builds the model from ``deepseek.deepseek_v3_fields`` with these layers in place of the ones
    ``first_k_dense_replace`` names (checked here to agree where the config has it).

    Raises:
        ValueError: a ``partial_rotary_factor`` other than 1 (module docstring, 2.); ``mlp_layer_types`` of the
            wrong length or with a value other than "dense" / "sparse"; no MoE layer; or ``first_k_dense_replace`` /
            ``moe_layer_freq`` naming other layers than transformers builds.
    """
    rope = config.get("rope_parameters") or {}
    partial = float(rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) or 1.0)
    if partial != 1.0:
        raise _Unsupported(
            f"{GLM4_MOE_LITE} with partial_rotary_factor={partial}: expected 1.0 (all qk_rope_head_dim channels rotate)"
        )
    n = int(config["num_hidden_layers"])
    types = list(config.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1))
    if len(types) != n or set(types) - {"dense", "sparse"}:
        raise _Unsupported(f"{GLM4_MOE_LITE} with mlp_layer_types={types}: expected {n} of 'dense' / 'sparse'")
    layers = tuple(t == "sparse" for t in types)
    if not any(layers):
        raise _Unsupported(f"{GLM4_MOE_LITE} with mlp_layer_types={types} leaves no MoE layer")
    if "first_k_dense_replace" in config:  # what SGLang builds from
        k, freq = int(config["first_k_dense_replace"] or 0), int(config.get("moe_layer_freq") or 1)
        sglang = tuple(i >= k and i % freq == 0 for i in range(n))
        if sglang != layers:
            raise _Unsupported(
                f"{GLM4_MOE_LITE} with first_k_dense_replace={k}, moe_layer_freq={freq} (SGLang's MoE layers "
                f"{[i for i in range(n) if sglang[i]]}) but mlp_layer_types={types} (transformers' "
                f"{[i for i in range(n) if layers[i]]}): expected the same layers"
            )
    return layers
