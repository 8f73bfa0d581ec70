"""The learning rate of each optimizer step: linear warm-up, then constant / linear / cosine / inverse-square-root decay.

The torch backend's schedule, from the flags megatron-core's ``OptimizerParamScheduler`` reads
(``--lr``, ``--min-lr``, ``--lr-warmup-iters``, ``--lr-decay-style``, ``--lr-decay-iters``), with the
same formulas after warm-up. For optimizer step ``k`` (0-based), W warm-up steps, D decay steps::

    k <  W:   lr * (k + 1) / W
    k >= W:   min_lr + (lr - min_lr) * f((k - W) / (D - W)), the ratio capped at 1
              f = 1 (constant), 1 - r (linear), 0.5 * (1 + cos(pi r)) (cosine)
    inverse-square-root:  lr * sqrt(max(W, 1)) / sqrt(k + 1) after warm-up, floored at min_lr

Example: lr 3e-3, min_lr 3e-4, W 50, D 1200, cosine -> step 0: 6e-5, step 49: 3e-3,
step 625: 1.65e-3, step 1199: ~3e-4 (the arithmetic warm start's schedule: ``scripts/make_warmstart.py``
runs ``slime train`` with these flags).

Departure from megatron-core: its warm-up gives step k the rate ``lr * k / W`` (the first step runs
at lr 0 when it starts from 0); here step k gets ``lr * (k + 1) / W``, so no step is wasted.
"""

from __future__ import annotations

import math

import msgspec

from slime.config import TrainConfig

__all__ = ["lr_at", "resolve_lr_schedule"]


def resolve_lr_schedule(config: TrainConfig, num_optimizer_steps: int) -> TrainConfig:
    """``config`` with the steps Megatron derives from the run's length filled in.

    ``num_optimizer_steps``: the run's optimizer steps (steps x samples per step / --global-batch-size).
    As megatron-core does with ``train_iters``: an unset ``--lr-decay-iters`` of a decaying style
    becomes ``num_optimizer_steps``, and ``--lr-warmup-fraction f`` becomes
    ``lr_warmup_iters = round(f x lr_decay_iters)`` (``num_optimizer_steps`` if still unset).
    Example: 1000 steps, cosine, fraction 0.1 -> decay over 1000, warm-up 100.
    """
    m = config.megatron
    decay = m.lr_decay_iters
    if decay is None and m.lr_decay_style not in ("constant", "inverse-square-root"):
        decay = num_optimizer_steps
    warmup = m.lr_warmup_iters
    if m.lr_warmup_fraction is not None:
        warmup = round(m.lr_warmup_fraction * (decay or num_optimizer_steps))
        if decay is not None and warmup >= decay:
            warmup = decay - 1  # at least one step after warm-up
    if (decay, warmup) == (m.lr_decay_iters, m.lr_warmup_iters):
        return config
    return msgspec.structs.replace(
        config,
        megatron=msgspec.structs.replace(
            m, lr_decay_iters=decay, lr_warmup_iters=max(warmup, 0), lr_warmup_fraction=None
        ),
    )


def lr_at(config: TrainConfig, step: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based) under ``config`` (module docstring).

    Raises:
        ValueError: a decaying style without ``--lr-decay-iters``, ``--min-lr`` above ``--lr``, or
            ``--lr-warmup-iters`` not below ``--lr-decay-iters``.
    """
    m = config.megatron
    lr, min_lr, warmup = config.lr, m.min_lr, m.lr_warmup_iters
    if m.min_lr > lr:
        raise ValueError(f"--min-lr={m.min_lr} must be <= --lr={lr}")
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    style = m.lr_decay_style
    if style == "constant":
        return lr
    if style == "inverse-square-root":
        return max(min_lr, lr * math.sqrt(max(warmup, 1)) / math.sqrt(step + 1))
    if m.lr_decay_iters is None:
        raise ValueError(f"--lr-decay-style {style} needs --lr-decay-iters (optimizer steps to decay over)")
    if warmup >= m.lr_decay_iters:
        raise ValueError(f"--lr-warmup-iters={warmup} must be < --lr-decay-iters={m.lr_decay_iters}")
    ratio = min(1.0, (step - warmup) / (m.lr_decay_iters - warmup))
    coeff = 1.0 - ratio if style == "linear" else 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + (lr - min_lr) * coeff
