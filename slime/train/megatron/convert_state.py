"""Whole state dicts through ``convert``'s per-parameter conversion: one rank's megatron state dict from an HF one,
and HF tensors gathered from all ranks' state dicts (``slime convert``, the conversion tests).

Kept apart from ``convert`` (module size); the layouts and names are ``convert``'s docstring.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from torch import Tensor

from slime.train.megatron.arch import ModelArch
from slime.train.megatron.convert import Ranks, hf_to_mcore_param, is_expert, mcore_names, mcore_param_to_hf

__all__ = ["hf_to_mcore", "mcore_to_hf", "iter_mcore_to_hf"]


def hf_to_mcore(
    hf_state: Mapping[str, Tensor], arch: ModelArch, *, tp_size: int = 1, tp_rank: int = 0,
    ep_size: int = 1, ep_rank: int = 0, etp_size: int | None = None, etp_rank: int | None = None,
) -> dict[str, Tensor]:  # fmt: skip
    """The full megatron-core state dict of one rank (``mcore_names`` order); arguments as ``hf_to_mcore_param``."""
    ranks = Ranks(
        tp_size=tp_size, tp_rank=tp_rank, ep_size=ep_size, ep_rank=ep_rank, etp_size=etp_size, etp_rank=etp_rank
    )
    return {
        name: hf_to_mcore_param(name, hf_state.__getitem__, arch, **ranks)
        for name in mcore_names(arch, ep_size=ep_size)
    }


def iter_mcore_to_hf(
    shard_states: Sequence[Mapping[str, Tensor]],
    arch: ModelArch,
    *,
    expert_shard_states: Sequence[Sequence[Mapping[str, Tensor]]] | None = None,
) -> Iterator[tuple[str, Tensor]]:
    """HF tensors one megatron parameter at a time; arguments as ``mcore_to_hf``."""
    experts = expert_shard_states if expert_shard_states is not None else [shard_states]
    ep_size = len(experts)
    for name in mcore_names(arch, ep_size=ep_size):
        if is_expert(name):
            for ep_rank, states in enumerate(experts):
                yield from mcore_param_to_hf(
                    name, [s[name] for s in states], arch, ep_size=ep_size, ep_rank=ep_rank
                ).items()
        else:
            yield from mcore_param_to_hf(name, [s[name] for s in shard_states], arch).items()


def mcore_to_hf(
    shard_states: Sequence[Mapping[str, Tensor]],
    arch: ModelArch,
    *,
    expert_shard_states: Sequence[Sequence[Mapping[str, Tensor]]] | None = None,
) -> dict[str, Tensor]:
    """Gather the state dicts of all TP ranks (rank order) into one HF state dict.

    Args:
        shard_states: one state dict per TP rank; every parameter but the routed experts' is read here.
        arch: the model.
        expert_shard_states: ``[ep_rank][etp_rank]`` state dicts holding the routed experts'
            parameters (their local names); default ``[shard_states]`` (EP = 1, ETP = TP).

    A tied model gets no ``lm_head.weight`` (HF ties it on load).

    Raises:
        ValueError: no state dicts given.
    """
    if not shard_states or (expert_shard_states is not None and not all(expert_shard_states)):
        raise ValueError("mcore_to_hf: no shard state dicts given")
    return dict(iter_mcore_to_hf(shard_states, arch, expert_shard_states=expert_shard_states))
