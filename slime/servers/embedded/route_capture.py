"""The experts each token was routed to, captured from transformers' own MoE routers (``return_routed_experts``).

transformers' MoE layers (DeepSeek-V3, GLM-4.5, Qwen2/3-MoE) route through a module ``layer.mlp.gate`` whose
forward returns ``(router_logits, weights, indices)``, ``indices`` int [N, k] over the forward's N = rows x
positions tokens in row-major order. ``RouteCapture`` puts a forward hook on each such gate and keeps the
indices of the last forward; after the forward the runner hands each request its rows: a prefill gives a
request one row per context token (its left padding dropped), each decode step one more row. A request's
routes are SGLang's ``meta_info.routed_experts``: int32 [input + output - 1, num_hidden_layers, k] (the last
sampled token is never fed), dense layers' rows zero (``slime.routed_experts`` has the format).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slime.servers.embedded.request import EngineRequest

__all__ = ["RouteCapture"]


class RouteCapture:
    """Forward hooks on a transformers causal LM's MoE gates (module docstring); inert on a dense model.

    Args:
        model: an HF ``*ForCausalLM`` whose decoder layers are ``model.model.layers``.
    """

    def __init__(self, model: torch.nn.Module):
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        self.num_layers = len(layers)
        self.topk = int(getattr(model.config, "num_experts_per_tok", 0) or 0)
        self._last: dict[int, torch.Tensor] = {}
        self._hooks = []
        for i, layer in enumerate(layers):
            gate = getattr(getattr(layer, "mlp", None), "gate", None)
            if isinstance(gate, torch.nn.Module) and self.topk:
                self._hooks.append(gate.register_forward_hook(self._keeper(i)))

    @property
    def is_moe(self) -> bool:
        """Whether any layer has a router to capture."""
        return bool(self._hooks)

    def _keeper(self, layer: int):  # noqa: ANN202 - a forward hook
        def keep(_module: torch.nn.Module, _args: object, out: object) -> None:
            indices = out[-1] if isinstance(out, tuple) else None
            if isinstance(indices, torch.Tensor) and not indices.is_floating_point():
                self._last[layer] = indices.detach()

        return keep

    def _grid(self, rows: int, width: int) -> torch.Tensor:
        """The last forward's routes as int32 [rows, width, num_layers, k] (zeros for dense layers); then forgotten."""
        out = torch.zeros((rows, width, self.num_layers, self.topk), dtype=torch.int32)
        for layer, indices in self._last.items():
            out[:, :, layer] = indices.view(rows, width, self.topk).to(torch.int32)
        self._last.clear()
        return out

    def after_prefill(self, reqs: Sequence[EngineRequest], mask: torch.Tensor) -> None:
        """A left-padded prefill of ``reqs`` (``mask`` bool [K, T], True = real token): each asking request's
        routes restart with its context's rows (a retracted request's re-prefill covers all of its tokens)."""
        if not self.is_moe or not any(r.return_routed_experts for r in reqs):
            self._last.clear()
            return
        grid = self._grid(*mask.shape)
        for i, req in enumerate(reqs):
            if req.return_routed_experts:
                req.routes = [grid[i, mask[i]]]

    def after_decode(self, reqs: Sequence[EngineRequest]) -> None:
        """One decode step of the running ``reqs`` (one fed token each): one more row for each asking request."""
        if not self.is_moe or not any(r.return_routed_experts for r in reqs):
            self._last.clear()
            return
        grid = self._grid(len(reqs), 1)
        for i, req in enumerate(reqs):
            if req.return_routed_experts:
                req.routes.append(grid[i])
