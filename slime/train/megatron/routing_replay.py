"""MoE routing replay (slime's ``--use-rollout-routing-replay``): the trainer's routers take the experts the engine chose.

Why: an MoE policy's logprob of a token depends on which experts the token went to. The engine (SGLang's bf16
kernels) and the trainer (megatron-core) compute router scores with different rounding, so near-ties pick
different experts, and the trainer then scores a rollout under another expert mixture than the one it was
sampled from: a trainer/engine logprob gap that no amount of matching the dense parts' numerics removes. Replaying
the engine's routes makes the trainer's logprob and train passes use the engine's experts; the routing *weights* are
still the trainer's own scores gathered at those experts (megatron-core's ``RouterReplay``), so the router keeps
its gradient.

Wire format, SGLang 0.5.17's ``meta_info.routed_experts`` (``return_routed_experts: true``, server flag
``--enable-return-routed-experts``): base64 of int32 ``[T, L, k]`` in C order, with T = prompt + output tokens - 1
(every token the model was fed; the last sampled one never was), L = ``num_hidden_layers`` (a dense layer's rows
carry nothing) and k = ``num_experts_per_tok``. ``decode_routed_experts`` / ``encode_routed_experts`` read and write
it; ``moe_layer_routes`` keeps the MoE layers' rows.

``RoutingReplay`` attaches a megatron-core ``RouterReplay`` to every ``TopKRouter`` of a built model (model order,
one per MoE layer) and, inside ``replaying(routes)``, makes each take its layer's experts from ``routes``
[t, L_moe, k] (the packed micro-batch's tokens, ``t`` of them, in the router's token order). Scope: one pipeline stage
holding every MoE layer, no context or sequence parallelism (each rank's router sees all of the micro-batch's
tokens; under sequence parallelism a rank would need its own slice).

In the train step (``slime.train.megatron.step``), ``StepRoutes`` does the wiring: a batch whose samples carry
routes (``TrainBatch.routed_experts``, [B, L, R], R = num_hidden_layers x top-k, from ``Sample.routed_experts``)
gets each packed micro-batch's routes (``packed_routes``: sample ``s`` at pack offset ``o`` with ``n`` tokens puts
its rows ``0 .. n - 2`` at positions ``o .. o + n - 2``, the packed tokens' order; its last token and the pack's
padding, whose outputs predict nothing, take experts ``0 .. k - 1``), and both the old-logprob pass and the
train pass (forward and backward, so a recomputed forward replays too) run inside ``replaying`` of them.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from slime.train.batch import TrainBatch
from slime.train.megatron._mcore import mcore
from slime.train.megatron.packing import PackedMicroBatch

__all__ = [
    "decode_routed_experts",
    "encode_routed_experts",
    "moe_layer_routes",
    "RoutingReplay",
    "packed_routes",
    "StepRoutes",
]


def decode_routed_experts(data: str, *, num_layers: int, topk: int) -> Tensor:
    """SGLang's base64 ``routed_experts`` -> int32 [T, num_layers, topk] (module docstring).

    Raises:
        ValueError: the decoded length is not a multiple of ``num_layers * topk``.
    """
    flat = np.frombuffer(base64.b64decode(data), dtype=np.int32)
    if flat.size % (num_layers * topk):
        raise ValueError(
            f"routed_experts: {flat.size} ints is not a whole number of tokens of {num_layers} layers x top-{topk}"
        )
    return torch.from_numpy(flat.copy()).view(-1, num_layers, topk)


def encode_routed_experts(routes: Tensor) -> str:
    """int [T, L, k] -> SGLang's base64 of int32 in C order (``decode_routed_experts``' inverse)."""
    return base64.b64encode(routes.to(torch.int32).contiguous().numpy().tobytes()).decode("ascii")


def moe_layer_routes(routes: Tensor, moe_layers: Sequence[bool]) -> Tensor:
    """[T, L, k] over all layers -> [T, L_moe, k]: the rows of the MoE layers (``ModelArch.moe_layers``) only.

    Raises:
        ValueError: ``routes`` does not have one row per layer.
    """
    if routes.shape[1] != len(moe_layers):
        raise ValueError(f"routed_experts has {routes.shape[1]} layers; the model has {len(moe_layers)}")
    return routes[:, [i for i, moe in enumerate(moe_layers) if moe]]


class RoutingReplay:
    """The routers of one model, made to replay given routes inside ``replaying`` (module docstring).

    Args:
        model: a built megatron ``GPTModel`` (maybe wrapped); its ``TopKRouter`` modules, in model order, are
            its MoE layers'.

    Raises:
        ValueError: the model has no router.
    """

    def __init__(self, model: torch.nn.Module):
        replay_cls = mcore("megatron.core.transformer.moe.router_replay").RouterReplay
        router_cls = mcore("megatron.core.transformer.moe.router").TopKRouter
        self._routers: list[Any] = [m for m in model.modules() if isinstance(m, router_cls)]
        if not self._routers:
            raise ValueError("routing replay needs an MoE model: this one has no router")
        for router in self._routers:
            if router.router_replay is None:  # built without moe_enable_routing_replay
                router.router_replay = replay_cls()

    @property
    def num_layers(self) -> int:
        return len(self._routers)

    @contextlib.contextmanager
    def replaying(self, routes: Tensor) -> Iterator[None]:
        """Every forward inside takes layer j's experts from ``routes[:, j]`` (int [t, num_layers, k], t = the
        tokens each router sees); outside, routing is the routers' own again.

        Raises:
            ValueError: ``routes`` has another number of layers than the model has routers.
        """
        if routes.dim() != 3 or routes.shape[1] != self.num_layers:
            raise ValueError(f"routes of shape {tuple(routes.shape)}: expected [tokens, {self.num_layers}, top-k]")
        action = mcore("megatron.core.transformer.moe.router_replay").RouterReplayAction.REPLAY_FORWARD
        for j, router in enumerate(self._routers):
            router.router_replay.set_target_indices(routes[:, j].to(torch.long))
            router.router_replay.set_router_replay_action(action)
        try:
            yield
        finally:
            for router in self._routers:
                router.router_replay.clear_router_replay_action()
                router.router_replay.clear_indices()


def packed_routes(
    routes: Tensor, samples: Sequence[int], seq_lens: Tensor, num_tokens: int, *, moe_layers: Sequence[bool], topk: int
) -> Tensor:
    """One packed micro-batch's routes, int32 [num_tokens, L_moe, topk], in the packed tokens' order (module docstring;
    int32, half of int64's memory for the step's packs on the GPU; ``replaying`` widens each layer's).

    Args:
        routes: ``TrainBatch.routed_experts``, int [B, L, R] with R = ``len(moe_layers) * topk``.
        samples: the batch rows packed, in pack order (``PackedMicroBatch.samples``), back to back from 0.
        seq_lens: [B] tokens of each row.
        num_tokens: t, the pack's tokens (padding included).
        moe_layers: per layer, whether it is an MoE layer (``ModelArch.moe_layers``).

    Raises:
        ValueError: R is not layers x top-k, or the samples do not fit in ``num_tokens``.
    """
    num_layers = len(moe_layers)
    if routes.shape[2] != num_layers * topk:
        raise ValueError(
            f"routed_experts has {routes.shape[2]} ints per token; the model has {num_layers} layers x top-{topk}"
        )
    keep = [i for i, moe in enumerate(moe_layers) if moe]
    # positions that predict nothing (each sample's last token, padding) take experts 0..k-1
    out = torch.arange(topk, dtype=torch.int32).expand(num_tokens, len(keep), topk).clone()
    offset = 0
    for s in samples:
        n = int(seq_lens[s])
        if offset + n > num_tokens:
            raise ValueError(f"packed_routes: samples of {offset + n}+ tokens in a pack of {num_tokens}")
        out[offset : offset + n - 1] = routes[s, : n - 1].view(n - 1, num_layers, topk)[:, keep]
        offset += n
    return out


class StepRoutes:
    """The train step's routing replay (module docstring): ``attach`` gives a packed micro-batch its routes when
    the batch has them, ``replaying`` runs a pass on one with the model's routers taking them.

    Args:
        model: the policy (maybe wrapped); its routers get a ``RoutingReplay`` at the first batch with routes.
        moe_layers / topk: the architecture's (``ModelArch.moe_layers``, ``moe_router_topk``).
        sequence_parallel / cp_size / pp_size: the parallel layout, checked against the scope at that batch.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        moe_layers: Sequence[bool],
        topk: int,
        sequence_parallel: bool,
        cp_size: int,
        pp_size: int,
    ):
        self._model, self._moe_layers, self._topk = model, tuple(moe_layers), topk
        self._layout = (sequence_parallel, cp_size, pp_size)
        self._replay: RoutingReplay | None = None

    def attach(self, batch: TrainBatch, mb: PackedMicroBatch) -> PackedMicroBatch:
        """``mb`` (a ``PackedMicroBatch`` of ``batch``, a ``TrainBatch``) with ``mb.routes`` set when the batch
        carries routes; returned as is otherwise.

        Raises:
            ValueError: routes on a layout out of scope (sequence / context / pipeline parallelism), or on a
                dense model; what ``packed_routes`` raises.
        """
        if batch.routed_experts is None or not mb.samples:
            return mb
        if self._replay is None:
            self._replay = self._check_scope()
        routes = packed_routes(
            batch.routed_experts, mb.samples, batch.seq_lens, int(mb.input_ids.shape[1]),
            moe_layers=self._moe_layers, topk=self._topk,
        )  # fmt: skip
        mb.routes = routes.to(mb.input_ids.device)
        return mb

    def replaying(self, mb: PackedMicroBatch) -> contextlib.AbstractContextManager[None]:
        """The model's routers take ``mb.routes`` inside (nothing changes for a micro-batch without routes)."""
        if mb.routes is None or self._replay is None:
            return contextlib.nullcontext()
        return self._replay.replaying(mb.routes)

    def _check_scope(self) -> RoutingReplay:
        sequence_parallel, cp_size, pp_size = self._layout
        if sequence_parallel or cp_size > 1 or pp_size > 1:
            raise ValueError(
                "--use-rollout-routing-replay: not with --sequence-parallel, --context-parallel-size > 1 or "
                f"--pipeline-model-parallel-size > 1 (here {sequence_parallel}, {cp_size}, {pp_size}): every router "
                "must see all of a micro-batch's tokens"
            )
        return RoutingReplay(self._model)
