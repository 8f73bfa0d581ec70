"""One train step of the megatron backend, on every rank: ``MegatronTrainStep``, the collaborator of
``MegatronTrainer`` (``trainer.py``) that runs once the batch is on every rank.

One ``train_step``:

    rank 0: groups ─► build_train_batch (scores, masks, staleness check) ─► broadcast ("train", batch)
    every rank, per optimizer step of ``global_batch_size`` samples:
        plan_step: this DP rank's samples, packed into micro-batches (token budget or sample count)
    every rank, before the update (no grad; same micro-batches as training, so step 1 has ratio 1):
        old_logprobs (and ref_logprobs with a KL term) for its samples, summed over DP so every
        rank holds the whole [B, L] tensors ─► objective.with_advantages (same on every rank)
    every rank, per optimizer step:
        per micro-batch: GPTModel forward on the packed tokens ─► vocab_parallel_logprobs (or, with
            --logprob-impl liger, the final hidden states ─► fused_linear_logprobs) ─►
            unpack to [b, L] ─► objective.micro_batch_loss (the torch backend's loss code) ─► backward
            (DDP no_sync except on the last micro-batch)
        finalize_model_grads (DP gradient sum, sequence-parallel norm grads) ─► grad norm ─►
        skip if not finite, else clip to ``clip_grad`` and step megatron's optimizer; lr schedule +1
    policy_version += 1; metrics summed over DP ranks, returned on rank 0 (MoE models add the
    router metrics of ``slime.train.router_metrics``: load per expert, load-balancing
    loss, dropped tokens)

Loss scale: each micro-batch loss is already divided by the whole optimizer step's denominator
(samples for ``seq_mean``, trained tokens for ``token_mean``), so DDP must sum gradients over
data-parallel ranks rather than average them: ``calculate_per_token_loss=True`` in the
``TransformerConfig`` does exactly that, and ``finalize_model_grads`` gets no token count to
divide by. Tensor-parallel ranks compute the same loss; megatron's layers reduce their gradients.

MoE load-balancing loss (``--moe-aux-loss-coeff`` > 0): megatron-core attaches it to the router
output, scaled by the micro-batch's token count (``calculate_per_token_loss``), and multiplies its
gradient by ``MoEAuxLossAutoScaler``'s scale, which is set here to 1 / (tokens of the optimizer
step, all DP ranks), times the TP size under sequence parallelism (each TP rank then holds a
share of the loss scaled by its T / tp tokens): the trained term is coefficient x the
token-weighted mean of the per micro-batch losses, normalised over the step as the RL loss is.

Context parallelism (dense models): each CP rank runs its share of every packed sequence
(``slime.train.megatron.context_parallel``); logprobs and entropies are all-gathered into the
full packed order before the loss, so every CP rank computes the whole micro-batch's loss (same
denominators as one rank) and keeps only its own tokens' gradient; DDP sums over DP x CP.

Pipeline parallelism (dense models): ``_pipeline`` runs the micro-batches through megatron-core's
1F1B schedule (``pipeline.py``); the last stage computes logprobs and the loss, and broadcasts the
old/ref logprobs and the step's metrics over the pipeline group (rank 0, stage 0, reports them). The
optimizer step (gradients reduced, a non-finite norm skipped, clipped) is ``optimizer_step.py``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor

from slime.config import TrainConfig
from slime.train import objective
from slime.train.batch import TrainBatch
from slime.train.losses import loss_denominator
from slime.train.megatron._mcore import mcore
from slime.train.megatron.arch import ModelArch
from slime.train.megatron.layers import attention_path_metrics
from slime.train.megatron.logprobs import fused_linear_logprobs, vocab_parallel_logprobs
from slime.train.megatron.model import float16_wrapped, output_weight
from slime.train.megatron.optimizer_step import optimizer_step
from slime.train.megatron.packing import PackedMicroBatch, batch_to, pack_samples, plan_step, select_samples, to_device
from slime.train.megatron.parallel import ParallelContext
from slime.train.megatron.pipeline import run_pipeline
from slime.train.megatron.routing_replay import StepRoutes
from slime.train.megatron.step_metrics import TokenSums, batch_metrics, reduce_over_ranks, token_means
from slime.train.router_metrics import RouterStats
from slime.train_metrics import TrainMetrics

if TYPE_CHECKING:  # megatron-core ships no type information: these name its classes (mypy reads them as Any)
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer.transformer_config import TransformerConfig

LossOf = Callable[[int, Tensor, Tensor], Tensor]
"""``(micro-batch index, logprob [T], entropy [T]) -> its loss`` on the last pipeline stage (``_pipeline``)."""

__all__ = ["MegatronTrainStep"]

log = logging.getLogger(__name__)


class MegatronTrainStep:
    """The train step every rank runs (``train_batch``) over the models, optimizer and parallel context
    that ``MegatronTrainer`` built (the same objects: the trainer saves and syncs them).

    ``model`` is this pipeline stage's GPTModel (maybe bf16-wrapped), ``ddp`` its DDP wrapper,
    ``optimizer`` megatron's (chained) optimizer; ``rollout_temperature`` the engines' sampling temperature.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        arch: ModelArch,
        ctx: ParallelContext,
        tconfig: TransformerConfig,
        model: torch.nn.Module,
        ddp: DistributedDataParallel,
        ref_model: torch.nn.Module | None,
        optimizer: MegatronOptimizer,
        scheduler: OptimizerParamScheduler,
        router_stats: RouterStats | None,
        pad_token_id: int,
        pad_to: int,
        rollout_temperature: float,
    ):
        self.config, self.arch, self.ctx, self.tconfig = config, arch, ctx, tconfig
        self.model, self.ddp, self.ref_model, self.optimizer, self.scheduler = (
            model,
            ddp,
            ref_model,
            optimizer,
            scheduler,
        )
        self.router_stats, self.pad_token_id, self.pad_to, self.rollout_temperature = (
            router_stats,
            pad_token_id,
            pad_to,
            rollout_temperature,
        )
        self.routes = StepRoutes(model, moe_layers=arch.moe_layers, topk=arch.moe_router_topk, sequence_parallel=tconfig.sequence_parallel,
                                 cp_size=ctx.cp_size, pp_size=ctx.pp_size)  # fmt: skip

    def plan(self, batch: TrainBatch) -> list[tuple[int, int, list[PackedMicroBatch]]]:
        """Per optimizer step: (first sample, end sample, this rank's packed micro-batches).

        Under expert parallelism every MoE layer's forward is a collective over the EP ranks,
        which are different DP ranks: each rank then runs as many micro-batches as the busiest DP
        rank of the step, the missing ones as placeholders (``pack_samples`` of no sample, loss 0).
        Every rank computes the same plan, so no count is exchanged.
        """
        cfg, mcfg = self.config, self.config.megatron
        lens = batch.seq_lens.tolist()
        steps = []
        for start in range(0, batch.num_samples, cfg.global_batch_size):
            end = min(start + cfg.global_batch_size, batch.num_samples)
            plan = plan_step(
                lens[start:end],
                dp_size=self.ctx.dp_size,
                micro_batch_size=cfg.micro_batch_size,
                max_tokens_per_gpu=mcfg.max_tokens_per_gpu * self.ctx.cp_size
                if mcfg.use_dynamic_batch_size
                else None,  # CP ranks share a micro-batch
            )
            mbs = [self._pack(batch, [start + i for i in mb]) for mb in plan[self.ctx.dp_rank]]
            if self.ctx.ep_size > 1:
                busiest = max(len(p) for p in plan)
                mbs += [self._placeholder(batch) for _ in range(busiest - len(mbs))]
            steps.append((start, end, mbs))
        return steps

    def _pack(self, batch: TrainBatch, samples: list[int]) -> PackedMicroBatch:
        """Rows ``samples`` packed (this CP rank's share) on this rank's device, with their MoE routes if any."""
        c = self.ctx
        return self.routes.attach(batch, pack_samples(
            batch, samples, pad_token_id=self.pad_token_id, pad_to=self.pad_to, head_dim=self.arch.head_dim, rope_theta=self.arch.rope_theta,
            rotary_dim=self.arch.rotary_dim or None,
            cp_size=c.cp_size, cp_rank=c.cp_rank, cp_group=c.cp_group, device=c.device,
        ))  # fmt: skip

    def _placeholder(self, batch: TrainBatch) -> PackedMicroBatch:
        """A micro-batch of no sample (``pad_to`` pad tokens): this rank still joins the step's collectives."""
        return self._pack(batch, [])

    def _forward(
        self, model: torch.nn.Module, mb: PackedMicroBatch, *, entropy_grad: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Logprobs and entropies [T] of ``mb`` under ``model`` (one pipeline stage), full packed order."""
        return self._logprobs(self._run(model, mb), mb, model, entropy_grad=entropy_grad)

    def _run(self, model: torch.nn.Module, mb: PackedMicroBatch) -> Tensor:
        """One stage's forward on ``mb``. A bf16 model's last stage returns its bf16 logits (hidden
        states with liger) as they are: ``Float16Module``'s default fp32 copy of [t, vocabulary] would
        be one more 4-byte write and read per token and column, and its backward one more cast, for
        values the logprob passes upcast exactly anyway."""
        kwargs = {"fp32_output": False} if float16_wrapped(model) else {}
        return model(
            input_ids=mb.input_ids,
            position_ids=mb.position_ids,
            attention_mask=None,
            packed_seq_params=mb.params,
            **kwargs,
        )

    def _logprobs(
        self, out: Tensor, mb: PackedMicroBatch, model: torch.nn.Module, *, entropy_grad: bool
    ) -> tuple[Tensor, Tensor]:
        """The last stage's output -> logprobs and entropies [T], gathered over CP (``PackedMicroBatch.full``).

        ``out`` is [1, t, v] this rank's logits, or with ``--logprob-impl liger`` [1, t, h] the final
        hidden states (``model.output_hidden_states``), projected by ``model``'s output weight inside
        liger's fused function.
        """
        if self.config.megatron.logprob_impl == "liger":
            logprob, entropy = fused_linear_logprobs(
                out[0],
                output_weight(model),
                mb.labels[0],
                temperature=self.rollout_temperature,
                vocab_size=self.arch.vocab_size,
                entropy_grad=entropy_grad,
            )
        else:
            logprob, entropy = vocab_parallel_logprobs(
                out[0],
                mb.labels[0],
                temperature=self.rollout_temperature,
                vocab_size=self.arch.vocab_size,
                tp_rank=self.ctx.tp_rank,
                group=self.ctx.tp_group if self.ctx.tp_size > 1 else None,
                entropy_grad=entropy_grad,
            )
        return mb.full(logprob), mb.full(entropy)

    def _pipeline(
        self,
        model: torch.nn.Module,
        mbs: list[PackedMicroBatch],
        loss_of: LossOf,
        *,
        forward_only: bool,
        entropy_grad: bool = False,
    ) -> None:
        """``mbs`` through megatron-core's pipeline schedule (``pipeline.run_pipeline``: 1F1B; forward only for
        logprob passes). Every stage runs ``_run``; on the last stage ``loss_of(i, logprob [T], entropy [T])``
        returns micro-batch i's loss from ``_logprobs`` of its output, and the schedule runs its backward.
        Gradient sync waits for the last micro-batch (``config.no_sync_func``); ``_optimizer_step`` finalizes
        the gradients."""

        def stage_loss(i: int, stage: torch.nn.Module, out: Tensor) -> Tensor:
            logprob, entropy = self._logprobs(out, mbs[i], stage, entropy_grad=entropy_grad)
            return loss_of(i, logprob, entropy)

        run_pipeline(model, mbs, self._run, stage_loss, device=self.ctx.device, forward_only=forward_only)

    @torch.no_grad()
    def before_update(self, batch: TrainBatch, steps: list) -> TrainBatch:
        """``old_logprobs`` (and ``ref_logprobs``) for every sample, computed on the micro-batches of training."""
        bypass = self.config.use_rollout_logprobs  # the engine's logprobs are the old policy: no forward for them
        old = (
            to_device(batch.rollout_logprobs, self.ctx.device)
            if bypass
            else torch.zeros_like(batch.loss_mask, device=self.ctx.device)
        )
        ref = torch.zeros_like(old) if self.ref_model is not None else None
        # (model, [B, L] output) per forward pass; the rollout's logprobs are already whole on every rank
        passes = ([] if bypass else [(self.model, old)]) + (
            [] if self.ref_model is None or ref is None else [(self.ref_model, ref)]
        )
        self.model.eval()
        # Row indices go to the GPU before the first forward, without a host sync (``to_device``): no other
        # host sync until ``old.cpu()`` below.
        keep_placeholders = self.ctx.ep_size > 1  # their forwards are part of the EP collectives (``plan``)
        todo = [
            (mb, to_device(torch.as_tensor(mb.samples, dtype=torch.long), self.ctx.device))
            for _, _, mbs in steps
            for mb in mbs
            if mb.samples or keep_placeholders
        ]
        for model, out in passes:
            if self.ctx.pp_size > 1:
                if todo:

                    def write(i: int, lp: Tensor, _: Tensor, out: Tensor = out) -> Tensor:
                        out[todo[i][1], : todo[i][0].num_cols] = todo[i][0].unpack(lp)
                        return lp.new_zeros(())

                    self._pipeline(model, [mb for mb, _ in todo], write, forward_only=True)
                continue
            for mb, rows in todo:
                with self.routes.replaying(mb):  # --use-rollout-routing-replay: the engine's experts
                    lp = self._forward(model, mb)[0]
                if mb.samples:
                    out[rows, : mb.num_cols] = mb.unpack(lp)
        for _, t in passes:
            if self.ctx.dp_size > 1:
                dist.all_reduce(t, group=self.ctx.dp_group)  # each row was written by exactly one DP rank
            if self.ctx.pp_size > 1:
                dist.broadcast(t, src=self.ctx.last_stage_rank, group=self.ctx.pp_group)  # computed on the last stage
        self.model.train()
        return dataclasses.replace(batch, old_logprobs=old.cpu(), ref_logprobs=ref.cpu() if ref is not None else None)

    def train_batch(self, batch: TrainBatch, *, policy_version: int) -> TrainMetrics:
        """One train step on ``batch`` (every rank, collectively) from the weights of ``policy_version``."""
        t0 = time.perf_counter()
        cfg = self.config
        steps = self.plan(batch)
        if not objective.is_sft(cfg):  # --loss-type sft_loss needs no logprobs from before the update
            batch = objective.with_advantages(cfg, self.before_update(batch, steps))
        # Every micro-batch's rows go to the GPU now, while it is idle: selected on the CPU (no
        # index upload, no ``int(max)`` read back) and copied before the first forward, so the
        # loop below has no host sync between one micro-batch's backward and the next forward.
        subs = [
            [batch_to(select_samples(batch, mb.samples), self.ctx.device) if mb.samples else None for mb in mbs]
            for _, _, mbs in steps
        ]
        tokens = TokenSums()
        losses, grad_norms, num_skipped = [], [], 0
        for (start, end, mbs), step_subs in zip(steps, subs):
            step_mask = batch.loss_mask[start:end]
            if step_mask.sum() == 0:
                continue  # same decision on every rank: the batch is identical everywhere
            denom = loss_denominator(step_mask, cfg.loss_agg)  # a fully masked sample is in no denominator
            step_loss = self._backward_step(batch, start, end, mbs, step_subs, denom, tokens)
            grad_norm = self._optimizer_step()
            if not math.isfinite(grad_norm):
                num_skipped += 1
                log.warning("skipping optimizer step: grad_norm=%s at policy_version %d", grad_norm, policy_version)
            losses.append(step_loss)
            grad_norms.append(grad_norm)
        sums, losses_t = reduce_over_ranks(self.ctx, tokens.sums, losses)
        router = self._router_metrics()
        out = token_means(sums, tokens.seen, sft=objective.is_sft(cfg))
        out.update(batch_metrics(batch, measured_mismatch=not self.config.use_rollout_logprobs))
        out.update(objective.opd_metrics(batch))
        out.update(router)
        out.update(attention_path_metrics())  # GPU half precision only: which attention kernel the passes ran
        out.update(
            loss=float(losses_t.mean()) if len(losses_t) else 0.0,
            grad_norm=sum(grad_norms) / max(len(grad_norms), 1),
            num_optimizer_steps=float(len(losses)),
            num_skipped_steps=float(num_skipped),
            policy_version=float(policy_version + 1),
            lr=float(self.scheduler.get_lr({})),
            train_time_s=time.perf_counter() - t0,
        )
        return TrainMetrics.from_dict(out)

    def _backward_step(
        self,
        batch: TrainBatch,
        start: int,
        end: int,
        mbs: list[PackedMicroBatch],
        step_subs: list[TrainBatch | None],
        denom: float,
        tokens: TokenSums,
    ) -> Tensor:
        """Zero the gradients, then forward and backward this rank's micro-batches ``mbs`` of the optimizer
        step of samples ``start:end`` (``step_subs``: their rows on the device, None for a placeholder);
        returns the step's loss on this rank ([] float64, on the device: read back once, after the step)."""
        cfg = self.config
        if self.router_stats is not None:  # the aux loss is averaged over the step's tokens (module docstring)
            aux_scale = mcore("megatron.core.transformer.moe.moe_utils").MoEAuxLossAutoScaler
            sp = self.ctx.tp_size if self.tconfig.sequence_parallel else 1  # each TP rank scales by its T / tp tokens
            aux_scale.set_loss_scale(
                torch.tensor(sp / max(float(batch.seq_lens[start:end].sum()), 1.0), device=self.ctx.device)
            )
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        step_loss = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        if not mbs:
            mbs, step_subs = [self._placeholder(batch)], [None]

        def loss_of(mb: PackedMicroBatch, sub: TrainBatch | None, logprob: Tensor, entropy: Tensor) -> Tensor:
            if sub is None:  # a DP rank without samples in this step still joins the gradient reduce
                return logprob.sum() * 0.0
            loss, metrics = objective.micro_batch_loss(cfg, sub, mb.unpack(logprob), mb.unpack(entropy), denom)
            step_loss.add_(loss.detach())
            tokens.add(metrics)
            return loss

        entropy_grad = cfg.entropy_coef != 0.0
        if self.ctx.pp_size > 1:
            loss_at = lambda i, lp, ent: loss_of(mbs[i], step_subs[i], lp, ent)  # noqa: E731
            self._pipeline(self.ddp, mbs, loss_at, forward_only=False, entropy_grad=entropy_grad)
        else:
            for i, (mb, sub) in enumerate(zip(mbs, step_subs)):
                sync = contextlib.nullcontext() if i == len(mbs) - 1 else self.ddp.no_sync()
                with sync, self.routes.replaying(mb):  # backward inside: a recomputed forward replays as well
                    loss_of(mb, sub, *self._forward(self.ddp, mb, entropy_grad=entropy_grad)).backward()
        return step_loss

    def _router_metrics(self) -> dict[str, float]:
        """This step's router metrics (MoE models; every rank, collectively), {} for a dense model."""
        if self.router_stats is None:
            return {}
        groups = [self.ctx.dp_group]  # under sequence parallelism the hooks already summed over TP
        mcore("megatron.core.transformer.moe.moe_utils").clear_aux_losses_tracker()  # megatron's own copy, unused here
        return self.router_stats.collect(groups=groups)

    def _optimizer_step(self) -> float:
        """``optimizer_step`` over this step's DDP, optimizer and lr schedule: the gradient norm before
        clipping; a non-finite one skipped the update."""
        return optimizer_step(self.ddp, self.optimizer, self.scheduler, clip_grad=self.config.clip_grad)
