"""Packed micro-batches through megatron-core's pipeline schedule (``--pipeline-model-parallel-size`` > 1).

``run_pipeline`` hands megatron-core's forward-backward function (1F1B; forward only for the logprob
passes) the step's micro-batches by index: each stage runs its layers on micro-batch ``i`` and the
last stage turns its output into micro-batch ``i``'s loss. Which stage output that is, and what the
loss is, stay with the caller (``slime.train.megatron.step.MegatronTrainStep._pipeline``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from slime.train.megatron._mcore import mcore
from slime.train.megatron.packing import PackedMicroBatch

__all__ = ["run_pipeline"]


def run_pipeline(
    model: torch.nn.Module,
    mbs: list[PackedMicroBatch],
    forward: Callable[[torch.nn.Module, PackedMicroBatch], Tensor],
    loss: Callable[[int, torch.nn.Module, Tensor], Tensor],
    *,
    device: torch.device,
    forward_only: bool,
) -> None:
    """``mbs`` through megatron-core's pipeline schedule (1F1B; forward only for logprob passes).

    Stage 0 embeds, every stage runs its layers and exchanges activations (and their gradients) with
    its neighbours through megatron's P2P communication, shapes first (packed micro-batches differ in
    length: ``variable_seq_lengths``).

    Args:
        model: this rank's pipeline stage (or its DDP wrapper).
        mbs: the micro-batches, run in order.
        forward: ``(stage, micro-batch) -> the stage's output`` (the last stage's logits or hidden states).
        loss: on the last stage, ``(i, stage, output) -> micro-batch i's loss``, already divided by the
            step's denominator (megatron's ``calculate_per_token_loss`` keeps it as is); the schedule
            runs its backward unless ``forward_only``.
        device: this rank's device (the schedule's token count placeholder lives there).
        forward_only: no backward (logprob passes).
    """
    schedule = mcore("megatron.core.pipeline_parallel").get_forward_backward_func()
    zero = torch.zeros((), dtype=torch.int, device=device)

    def forward_step(
        data_iterator: Iterator[int], stage: torch.nn.Module
    ) -> tuple[Tensor, Callable[[Tensor], tuple[Tensor, Tensor, dict]]]:
        i = next(data_iterator)
        mb = mbs[i]
        out = forward(stage, mb)

        def loss_func(out: Tensor) -> tuple[Tensor, Tensor, dict]:
            return loss(i, stage, out), zero, {}

        return out, loss_func

    schedule(
        forward_step_func=forward_step, data_iterator=iter(range(len(mbs))), model=[model], num_microbatches=len(mbs),
        seq_length=max(mb.num_tokens for mb in mbs), micro_batch_size=1, forward_only=forward_only,
    )  # fmt: skip
