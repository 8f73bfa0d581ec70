"""One optimizer step of the megatron backend: gradients reduced, a non-finite norm skipped, clipped, stepped.

``optimizer_step`` mirrors megatron's ``ChainedOptimizer.step`` (prepare, norm, clip, step) with one
difference: a non-finite gradient norm skips the update (bf16 has no loss scaler to do it). The
train step (``slime.train.megatron.step.MegatronTrainStep._optimizer_step``) calls it once per
optimizer step, after the last micro-batch's backward.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from slime.train.megatron._mcore import mcore

if TYPE_CHECKING:  # megatron-core ships no type information: these name its classes (mypy reads them as Any)
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

__all__ = ["optimizer_step"]


def optimizer_step(
    ddp: DistributedDataParallel,
    optimizer: MegatronOptimizer,
    scheduler: OptimizerParamScheduler,
    *,
    clip_grad: float,
) -> float:
    """Reduce gradients, then step unless the gradient norm is not finite; returns the norm before clipping.

    Args:
        ddp: the model's megatron DDP wrapper (``finalize_model_grads`` sums its gradients over
            data-parallel ranks, and sequence-parallel norm gradients over TP).
        optimizer: megatron's (chained) optimizer.
        scheduler: its lr schedule, advanced by one after an update (not after a skipped step).
        clip_grad: clip to this total norm (0 = no clipping).
    """
    mcore("megatron.core.distributed").finalize_model_grads([ddp], num_tokens=None)
    if optimizer.prepare_grads():
        return float("nan")
    grad_norm = float(optimizer.get_grad_norm())
    if not math.isfinite(grad_norm):
        return grad_norm
    if clip_grad > 0:
        clip = mcore("megatron.core.optimizer.clip_grads").clip_grad_by_total_norm_fp32
        for o in getattr(optimizer, "chained_optimizers", [optimizer]):
            params = o.get_parameters()
            if params:
                clip(
                    params,
                    max_norm=clip_grad,
                    total_norm=grad_norm,
                    use_decoupled_grad=o.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8,
                )
    optimizer.step_with_ready_grads()
    scheduler.step(increment=1)
    return grad_norm
