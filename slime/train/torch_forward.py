"""The torch backend's forward passes (``TorchForward``, a collaborator of ``slime.train.torch_backend.TorchTrainer``).

Before the update, with no grad: each micro-batch's ``old_logprobs`` from the policy, plus
``ref_logprobs`` from the frozen reference and ``old_values`` from the critic when the config has
them, run exactly as training will slice the batch so the first optimizer step sees ratio 1. During
the update: each micro-batch's policy loss (``objective.micro_batch_loss``, with the MoE router hooks
when the model has routers) and the critic's clipped value loss. Every forward runs under the
trainer's autocast (``slime.train.torch_device``: bf16 with ``--bf16``, else fp32).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import Tensor
from transformers import PreTrainedModel

from slime.config import TrainConfig
from slime.train import objective
from slime.train.batch import MicroBatch, TrainBatch
from slime.train.critic import ValueModel, value_loss
from slime.train.logprobs import compute_token_logprobs, compute_token_logprobs_and_entropy
from slime.train.losses import LossAgg
from slime.train.router_metrics import RouterStats
from slime.train.torch_device import autocast

__all__ = ["TorchForward"]


class TorchForward:
    """The forward passes of one ``TorchTrainer`` over its models (the same objects: the trainer updates them).

    Args:
        config: the ``train`` section (loss, entropy and value-clip settings, ``use_rollout_logprobs``).
        model / ref_model / critic: the policy, the frozen reference (None without KL), the critic (None without PPO).
        router_stats: the MoE router hooks of ``model`` (None for a dense model).
        rollout_temperature: logits are divided by it, as the engines sample.
        device / bf16: where the tensors live; bf16 autocast (``slime.train.torch_device``).
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        model: PreTrainedModel,
        ref_model: PreTrainedModel | None,
        critic: ValueModel | None,
        router_stats: RouterStats | None,
        rollout_temperature: float,
        device: torch.device,
        bf16: bool,
    ):
        self.config, self.model, self.ref_model, self.critic, self.router_stats = (
            config,
            model,
            ref_model,
            critic,
            router_stats,
        )
        self.rollout_temperature, self.device, self.bf16 = rollout_temperature, device, bf16
        self.loss_agg: LossAgg = config.loss_agg

    def autocast(self) -> contextlib.AbstractContextManager:
        """The trainer's autocast context (bf16 with ``--bf16``, else none)."""
        return autocast(self.device, self.bf16)

    @torch.no_grad()
    def before_update(self, batch: TrainBatch, micro_batches: list[MicroBatch]) -> TrainBatch:
        """Fill ``old_logprobs`` (and ``ref_logprobs`` / ``old_values``), computed per micro-batch.

        Each span is run exactly as training will slice it (T trimmed to the span's longest
        sequence), so the first optimizer step sees ratio 1 exactly. Results are stitched into
        [B, L] tensors, zero beyond each span's own length.
        """
        temperature = self.rollout_temperature
        bypass = self.config.use_rollout_logprobs  # the engine's logprobs are the old policy: no forward for them
        old = batch.rollout_logprobs.clone() if bypass else torch.zeros_like(batch.loss_mask)  # [B, L]
        ref_model, critic = self.ref_model, self.critic
        ref = torch.zeros_like(old) if ref_model is not None else None
        values = torch.zeros_like(old) if critic is not None else None
        for indices in micro_batches:
            mb = batch.select(indices)
            rows = torch.as_tensor(indices, dtype=torch.long, device=old.device)[:, None]
            cols = torch.arange(mb.loss_mask.shape[1], device=old.device)[None, :]
            with self.autocast():
                if not bypass:
                    old[rows, cols] = compute_token_logprobs(
                        self.model, mb.input_ids, mb.attention_mask, temperature=temperature
                    )
                if ref_model is not None and ref is not None:
                    ref[rows, cols] = compute_token_logprobs(
                        ref_model, mb.input_ids, mb.attention_mask, temperature=temperature
                    )
                if critic is not None and values is not None:
                    values[rows, cols] = critic(mb.input_ids, mb.attention_mask).float()
        return dataclasses.replace(batch, old_logprobs=old, ref_logprobs=ref, old_values=values)

    def micro_batch_loss(self, mb: TrainBatch, denom: float) -> tuple[Tensor, dict[str, float]]:
        """The policy loss of micro-batch ``mb`` (``objective.micro_batch_loss``; ``denom``: the optimizer
        step's) and its metrics, with the router hooks counting its real tokens."""
        routers = (
            self.router_stats.tokens(mb.attention_mask) if self.router_stats is not None else contextlib.nullcontext()
        )
        with routers, self.autocast():
            logprobs, entropy = compute_token_logprobs_and_entropy(
                self.model,
                mb.input_ids,
                mb.attention_mask,
                temperature=self.rollout_temperature,
                entropy_grad=self.config.entropy_coef != 0.0,
            )  # [b, l], [b, l]
        return objective.micro_batch_loss(self.config, mb, logprobs, entropy, denom)

    def value_loss(self, mb: TrainBatch, denom: float) -> tuple[Tensor, dict[str, float]]:
        """The critic's clipped value loss of ``mb`` (``slime.train.critic.value_loss``) and its metrics."""
        assert self.critic is not None and mb.old_values is not None and mb.returns is not None
        with self.autocast():
            values = self.critic(mb.input_ids, mb.attention_mask).float()  # [b, l]
        return value_loss(
            values,
            mb.old_values,
            mb.returns,
            mb.loss_mask,
            value_clip=self.config.value_clip,
            loss_agg=self.loss_agg,
            loss_denominator=denom,
        )
