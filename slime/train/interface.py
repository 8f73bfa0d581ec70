"""The trainer seam: what the loop, checkpoints and weight sync need from a training backend.

``TorchTrainer`` (``torch_backend.py``) and ``MegatronTrainer`` (``megatron/trainer.py``) both satisfy
``Trainer``; the type checker holds them to it (docs/ARCHITECTURE.md, "Typed seams").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from slime.sync.base import WeightSource
from slime.train_metrics import TrainMetrics
from slime.types import Group

__all__ = ["Trainer", "TrainMetrics"]


class Trainer(WeightSource, Protocol):
    """A policy being trained: one optimizer step per call of ``train_step``; ``save_hf`` and
    ``state_dict_for_sync`` (``WeightSource``) give its weights to the engines."""

    policy_version: int
    """The version of the weights the trainer holds: +1 per ``train_step``."""

    def train_step(self, groups: Sequence[Group]) -> TrainMetrics:
        """Train on ``groups`` (one rollout step; blocking) and bump ``policy_version`` by one.

        Returns the step's metrics (``loss``, ``grad_norm``, ``lr``, ``policy_version``, ...); every
        backend sets the same fields for the same loss (``slime.train_metrics``).
        """
        ...
