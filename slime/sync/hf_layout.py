"""HF checkpoint names vs transformers' in-memory names for mixture-of-experts weights.

Weights travel between trainer and engines under the names of an HF checkpoint on disk (what
SGLang loads and what ``save_pretrained`` writes). For dense models those are the names of
``model.state_dict()``. transformers 5 keeps the routed experts of Qwen2-MoE / Qwen3-MoE (and
other ``gate_proj`` / ``up_proj`` / ``down_proj`` MoE models) fused in memory, one 3-D tensor per
layer and projection, while the checkpoint keeps one 2-D tensor per expert::

    in memory                                   on disk (expert e, intermediate width I)
    ...mlp.experts.gate_up_proj  [E, 2I, H]     ...mlp.experts.e.gate_proj.weight = [e, :I]
                                                ...mlp.experts.e.up_proj.weight   = [e, I:]
    ...mlp.experts.down_proj     [E, H, I]      ...mlp.experts.e.down_proj.weight = [e]

(``gate_up_proj[e]`` is gate stacked on up: the expert's forward chunks ``x @ gate_up_proj[e].T``
in two, SiLU on the first half.) ``checkpoint_views`` maps the in-memory state dict onto the
checkpoint names as views, so a writer can copy one expert's tensor into the fused parameter and
a reader can export checkpoint-named tensors without a second copy of the model.

Not covered: fused layouts other than the concatenated gate/up above (e.g. interleaved gate/up
columns) and expert biases; a state dict with neither is returned unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

__all__ = ["checkpoint_views"]

_GATE_UP, _DOWN = ".experts.gate_up_proj", ".experts.down_proj"


def checkpoint_views(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state`` (a ``model.state_dict()``) keyed by HF checkpoint names; fused experts become per-expert views.

    Args:
        state: name -> tensor, transformers' in-memory names.

    Returns:
        A new dict in ``state``'s order. Every tensor is ``state``'s own or a view of it (writing
        into a view writes the parameter); non-expert tensors keep their names.

    Example: ``model.layers.0.mlp.experts.gate_up_proj`` [4, 32, 32] (I = 16) becomes
    ``model.layers.0.mlp.experts.{0..3}.gate_proj.weight`` (rows 0..15 of each expert) and
    ``...up_proj.weight`` (rows 16..31), each [16, 32].
    """
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        if name.endswith(_GATE_UP) and t.dim() == 3 and t.shape[1] % 2 == 0:
            prefix, half = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :half]
                out[f"{prefix}{e}.up_proj.weight"] = t[e, half:]
        elif name.endswith(_DOWN) and t.dim() == 3:
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out
