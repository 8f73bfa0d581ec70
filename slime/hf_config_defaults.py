"""The architecture keys a ``config.json`` leaves out, as transformers fills them.

A ``config.json`` written by hand (or trimmed) may leave keys out; transformers' own model then uses
its config class's defaults, which differ between families (``routed_scaling_factor``: 2.5 for
DeepSeek-V3, 1.0 for GLM-4.5, 1.8 for GLM-4.7-Flash; ``first_k_dense_replace``: 3 and 1;
``norm_topk_prob``: True for DeepSeek-V3, False for Qwen3-MoE). The megatron build and the
``--dry-run`` flag check read the same keys, so both take the missing ones from transformers'
class, built from the file's own values (a derived default such as ``head_dim = hidden_size /
num_attention_heads`` follows the file). Keys present in the file always win.

RoPE keys are left as the file has them: transformers 5 moves the top-level ``rope_theta`` and
``partial_rotary_factor`` of older files into ``rope_parameters``, and the readers here already read
both places (``rope_parameters`` first).

Example: ``{"model_type": "deepseek_v3", "n_routed_experts": 8, ...}`` without ``routed_scaling_factor``
-> ``routed_scaling_factor`` 2.5, what ``DeepseekV3ForCausalLM`` scales the routed experts by.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from slime.types import JsonObject

__all__ = ["with_transformers_defaults"]

log = logging.getLogger(__name__)

_ROPE_KEYS = frozenset({"rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor"})


def with_transformers_defaults(config: Mapping[str, object]) -> JsonObject:
    """``config`` plus each key it lacks (RoPE keys aside) as transformers' config class for its
    ``model_type`` sets it. Unchanged when transformers does not know the ``model_type`` or its
    class refuses the file's values (the readers then report what is wrong in their own words)."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return dict(config)
    try:
        full = CONFIG_MAPPING[model_type].from_dict(dict(config)).to_dict()
    except Exception as exc:  # noqa: BLE001  # any refusal of transformers' class: keep the file as it is
        log.debug("%s: transformers' config class refused the file (%s); keys left as they are", model_type, exc)
        return dict(config)
    filled = {k: v for k, v in full.items() if k not in config and k not in _ROPE_KEYS}
    return {**filled, **config}
