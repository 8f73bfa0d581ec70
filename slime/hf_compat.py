"""transformers' KV-cache argument, across the releases slime supports (5.12.1 to 5.x).

transformers 5.24 renamed a model's KV-cache argument and output field from ``past_key_values``
to ``cache`` (the old name still works until 5.40, with a deprecation warning). SGLang 0.5.17
pins transformers 5.12.1, which knows only ``past_key_values``: there a ``cache=`` keyword
disappears into the model's ``**kwargs``, the forward runs without the cache, and the next decode
step fails or gives wrong logits. Every forward that feeds or reads a cache names it through
``CACHE_KWARG`` / ``output_cache``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers.modeling_outputs import CausalLMOutputWithPast

__all__ = ["CACHE_KWARG", "output_cache"]

CACHE_KWARG: str = (
    "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"
)
"""The keyword a causal LM's ``forward`` takes its KV cache by (and the output field holding it)."""


def output_cache(out: Any) -> Any:
    """The KV cache (a ``transformers.Cache``) of a causal LM's forward output ``out``."""
    return getattr(out, CACHE_KWARG)
