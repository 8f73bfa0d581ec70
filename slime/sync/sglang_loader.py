"""The receiving half of delta sync inside a real SGLang server: a ``--custom-weight-loader``.

Launch SGLang with ``--custom-weight-loader slime.sync.sglang_loader.load_delta`` (slime importable
in the server's environment); ``DeltaWeightSync`` then sends ``/update_weights_from_tensor`` with
``load_format="slime.sync.sglang_loader.load_delta"`` and one tensor ``("slime_delta", uint8)`` that
holds a ``slime.sync.codec`` payload. SGLang calls ``load_delta(model, named_tensors)`` on every TP
rank (docs/sglang.md#update-weights-from-tensor).

SGLang's model parameters are fused and sharded (``qkv_proj``, ``gate_up_proj``, TP slices), so the
HF-named tensors a delta refers to cannot be read back from the model. The loader therefore keeps a
CPU shadow copy of the HF-named weights it has loaded (one per model object, in the payload's dtype:
a full copy of the model in host memory), decodes against it, checks every rebuilt tensor against
the sender's sha256, hands full tensors to ``model.load_weights`` (which fuses and shards them) and
updates the shadow. Until a full sync has filled the shadow, a delta fails with ValueError; SGLang
answers 400 and the sender falls back to a full sync. The same happens on a checksum mismatch,
before anything reaches the model.

Not verified against a live SGLang server (the call signature is read from SGLang's
``model_runner.update_weights_from_tensor``; see docs/sglang.md#update-weights-from-tensor).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Protocol

import torch

from slime.sync.codec import decode_payload, decode_tensor
from slime.sync.wire import tensor_checksum

__all__ = ["load_delta"]


class WeightLoading(Protocol):
    """What SGLang passes a custom loader: its model, which loads ``(HF name, tensor)`` pairs."""

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> object: ...


_SHADOWS: weakref.WeakKeyDictionary[WeightLoading, dict[str, torch.Tensor]] = weakref.WeakKeyDictionary()
"""model -> {HF name: CPU tensor it holds}. Module state on purpose: SGLang gives a loader nothing
else to keep it in, and it must outlive each call."""


def load_delta(model: WeightLoading, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Apply one delta payload to ``model`` (an SGLang model with ``load_weights``).

    Raises:
        ValueError: not exactly one ``slime_delta`` tensor, a malformed payload, a delta against a
            tensor the shadow lacks, or a sha256 mismatch (nothing is loaded then).
    """
    if len(named_tensors) != 1 or named_tensors[0][0] != "slime_delta":
        raise ValueError(f"expected one ('slime_delta', uint8 tensor), got names {[n for n, _ in named_tensors][:5]}")
    blob = named_tensors[0][1].detach().cpu().numpy().tobytes()
    _, metas, parts = decode_payload(blob)
    shadow = _SHADOWS.setdefault(model, {})
    rebuilt = {name: decode_tensor(name, meta, parts, shadow.get(name)) for name, meta in metas.items()}
    bad = [name for name, t in rebuilt.items() if tensor_checksum(t) != metas[name]["sha256"]]
    if bad:
        raise ValueError(
            f"delta sync: sha256 mismatch on {len(bad)} of {len(rebuilt)} tensors (e.g. {bad[:3]}); send a full sync"
        )
    model.load_weights(list(rebuilt.items()))
    shadow.update({name: t.clone() for name, t in rebuilt.items()})
