"""The megatron-core training backend: ``MegatronTrainer``, with ``TorchTrainer``'s interface.

Every torchrun rank builds one (collectively); rank 0 is the driver, the others call ``serve``
(``slime.train.megatron.parallel`` describes the command channel). One ``train_step``:

    rank 0: groups ─► build_train_batch (scores, masks, staleness check) ─► broadcast ("train", batch)
    every rank, per optimizer step of ``global_batch_size`` samples:
        plan_step: this DP rank's samples, packed into micro-batches (token budget or sample count)
    every rank, before the update (no grad; same micro-batches as training, so step 1 has ratio 1):
        old_logprobs (and ref_logprobs with a KL term) for its samples, summed over DP so every
        rank holds the whole [B, L] tensors ─► objective.with_advantages (same on every rank)
    every rank, per optimizer step:
        per micro-batch: GPTModel forward on the packed tokens ─► vocab_parallel_logprobs ─►
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
1F1B schedule; the last stage computes logprobs and the loss, and broadcasts the old/ref logprobs
and the step's metrics over the pipeline group (rank 0, stage 0, reports them).

Not covered (raise at construction): the PPO critic (``--advantage-estimator ppo|gae``), CP or PP
for MoE models, and running without CUDA (megatron-core's optimizer and DDP
allocate on the GPU; use ``--train-backend torch`` on a CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import math
import threading
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from slime.config import TrainConfig
from slime.train import objective
from slime.train.batch import TrainBatch, build_train_batch, rl_batch_metrics
from slime.train.determinism import enable_deterministic_mode
from slime.train.megatron._mcore import mcore
from slime.train.megatron.arch import ModelArch, load_hf_config
from slime.train.megatron.logprobs import vocab_parallel_logprobs
from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config
from slime.train.megatron.packing import PackedMicroBatch, pack_samples, plan_step, select_samples
from slime.train.megatron.parallel import ControlChannel, ParallelContext, init_parallel
from slime.train.megatron.router_metrics import attach_megatron_routers
from slime.train.megatron.weights import iter_hf_weights, write_hf_dir
from slime.types import Group

__all__ = ["MegatronTrainer", "serve_if_worker"]

log = logging.getLogger(__name__)

_TOKEN_METRICS = (
    "pg_clipfrac", "approx_kl", "ratio_mean", "entropy", "tis_mean", "tis_clipfrac", "dual_clipfrac", "kl_loss",
    "mis_rho_mean", "mis_mask_frac_low", "mis_mask_frac_high", "mis_mean", "behav_imp_weight_mean", "behav_mask_frac", "nll",
)  # fmt: skip
"""Token-mean metrics (as the torch backend reports them); the first four always (RL), ``nll`` with ``sft_loss``."""


class MegatronTrainer:
    """megatron-core ``GPTModel`` + DDP + megatron's optimizer, trained with slime's RL objective.

    Args:
        config: the ``train`` section (algorithm, batch sizes, lr, ``config.megatron``).
        model_dir: HF directory (Llama / Qwen2 / Qwen3 dense, Qwen3-MoE / Qwen2-MoE) the weights start from; also the
            source of config and tokenizer files in every ``save_hf`` output.
        policy_version: version of the weights in ``model_dir``.
        rollout_temperature, max_staleness, seed: as ``TorchTrainer``'s (the run passes the rollout, loop and
            root config's values).

    Raises:
        RuntimeError: no CUDA device. ValueError: an unsupported option (module docstring) or
            architecture (``UnsupportedArchitecture``, a ValueError).
    """

    def __init__(self, config: TrainConfig, *, model_dir: str, policy_version: int = 0, rollout_temperature: float = 1.0,
                 max_staleness: int | None = None, seed: int = 1234):
        if not torch.cuda.is_available():
            raise RuntimeError("--train-backend megatron needs CUDA (megatron-core's optimizer and DDP allocate on the GPU); use --train-backend torch on a CPU")
        if objective.needs_critic(config):
            raise ValueError(f"--advantage-estimator {config.advantage_estimator} needs a critic, which the megatron backend does not have yet; use --train-backend torch")
        self.config = config
        self.rollout_temperature, self.max_staleness = rollout_temperature, max_staleness
        self.model_dir = model_dir
        self.policy_version = policy_version
        self._lock = threading.Lock()
        if config.deterministic_mode:
            enable_deterministic_mode(seed)
        mcfg = config.megatron
        self.arch = ModelArch.from_hf_config(load_hf_config(model_dir))
        self.tconfig = transformer_config(self.arch, mcfg)  # validates parallel sizes before any group exists
        self.ctx: ParallelContext = init_parallel(mcfg, seed=seed)
        self.channel = ControlChannel(self.ctx)
        self.pad_token_id = int(load_hf_config(model_dir).get("pad_token_id") or 0)
        self.pad_to = self.ctx.tp_size if self.tconfig.sequence_parallel else 1
        self.model, self.ddp = self._build(model_dir, trainable=True)
        self.ref_model = None
        if objective.needs_reference(config):
            self.ref_model, _ = self._build(config.ref_load or model_dir, trainable=False)
        self.optimizer = self._optimizer()
        self.scheduler = self._scheduler()
        self.router_stats = None
        if self.arch.is_moe:
            sp_group = self.ctx.tp_group if self.tconfig.sequence_parallel else None
            self.router_stats = attach_megatron_routers(self.model, num_experts=self.arch.num_experts, topk=self.arch.moe_router_topk, device=self.ctx.device, tp_group=sp_group)
        log.info(
            "megatron backend: %s, %d layers%s, TP=%d CP=%d PP=%d DP=%d EP=%d ETP=%d, bf16=%s, sequence_parallel=%s, packing=%s",
            self.arch.family, self.arch.num_layers,
            f" ({sum(self.arch.moe_layers)} MoE: {self.arch.num_experts} experts, top-{self.arch.moe_router_topk})" if self.arch.is_moe else "",
            self.ctx.tp_size, self.ctx.cp_size, self.ctx.pp_size, self.ctx.dp_size, self.ctx.ep_size, self.ctx.etp_size, mcfg.bf16, self.tconfig.sequence_parallel,
            f"{mcfg.max_tokens_per_gpu} tokens" if mcfg.use_dynamic_batch_size else f"{config.micro_batch_size} samples",
        )

    # --- construction -------------------------------------------------------------------------

    def _build(self, hf_dir: str, *, trainable: bool) -> tuple[Any, Any]:
        """GPTModel on this GPU with ``hf_dir``'s weights, bf16-wrapped if asked; DDP-wrapped if trainable."""
        self._use_device()
        arch = ModelArch.from_hf_config(load_hf_config(hf_dir))
        if arch != self.arch:
            raise ValueError(f"{hf_dir}: architecture {arch} differs from the policy's {self.arch}")
        c = self.ctx
        model = build_gpt_model(arch, self.tconfig, tp_size=c.tp_size, pp_rank=c.pp_rank)
        load_hf_weights(
            model, HFCheckpointReader(hf_dir), arch, tp_size=c.tp_size, tp_rank=c.tp_rank, ep_size=c.ep_size, ep_rank=c.ep_rank,
            etp_size=c.etp_size, etp_rank=c.etp_rank, pp_size=c.pp_size, pp_rank=c.pp_rank,
        )  # fmt: skip
        if self.tconfig.bf16:
            model = mcore("megatron.core.transformer.module").Float16Module(self.tconfig, model)
        if not trainable:
            return model.eval().requires_grad_(False), None
        dist_mod = mcore("megatron.core.distributed")
        mcfg = self.config.megatron
        ddp_config = dist_mod.DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=mcfg.overlap_grad_reduce,
            use_distributed_optimizer=mcfg.use_distributed_optimizer,
            check_for_nan_in_grad=False,  # a non-finite step is skipped and counted instead
        )
        ddp = dist_mod.DistributedDataParallel(self.tconfig, ddp_config, module=model)
        self.tconfig.no_sync_func = ddp.no_sync
        return model, ddp

    def _optimizer(self) -> Any:
        cfg, mcfg = self.config, self.config.megatron
        opt = mcore("megatron.core.optimizer")
        opt_config = opt.OptimizerConfig(
            optimizer="adam",
            lr=cfg.lr,
            min_lr=mcfg.min_lr,
            weight_decay=cfg.weight_decay,
            adam_beta1=cfg.adam_beta1,
            adam_beta2=cfg.adam_beta2,
            adam_eps=mcfg.adam_eps,
            clip_grad=cfg.clip_grad,
            bf16=mcfg.bf16,
            params_dtype=self.tconfig.params_dtype,
            use_distributed_optimizer=mcfg.use_distributed_optimizer,
        )
        optimizer = opt.get_megatron_optimizer(opt_config, [self.ddp])
        _fuse_torch_adam(optimizer)
        return optimizer

    def _scheduler(self) -> Any:
        cfg, mcfg = self.config, self.config.megatron
        if mcfg.lr_decay_style != "constant" and mcfg.lr_decay_iters is None:
            raise ValueError(f"--lr-decay-style {mcfg.lr_decay_style} needs --lr-decay-iters (optimizer steps to decay over)")
        if mcfg.min_lr > cfg.lr:
            raise ValueError(f"--min-lr={mcfg.min_lr} must be <= --lr={cfg.lr}")
        decay_steps = mcfg.lr_decay_iters if mcfg.lr_decay_iters is not None else mcfg.lr_warmup_iters + 1
        if mcfg.lr_warmup_iters >= decay_steps:
            raise ValueError(f"--lr-warmup-iters={mcfg.lr_warmup_iters} must be < --lr-decay-iters={decay_steps}")
        Scheduler = mcore("megatron.core.optimizer_param_scheduler").OptimizerParamScheduler
        return Scheduler(
            self.optimizer,
            init_lr=0.0 if mcfg.lr_warmup_iters else cfg.lr,
            max_lr=cfg.lr,
            min_lr=mcfg.min_lr,
            lr_warmup_steps=mcfg.lr_warmup_iters,
            lr_decay_steps=decay_steps,
            lr_decay_style=mcfg.lr_decay_style,
            start_wd=cfg.weight_decay,
            end_wd=cfg.weight_decay,
            wd_incr_steps=1,
            wd_incr_style="constant",
        )

    def _use_device(self) -> None:
        """Make this rank's GPU current in the calling thread (the driver calls from worker threads)."""
        if self.ctx.device.type == "cuda":
            torch.cuda.set_device(self.ctx.device)

    # --- the driver's interface (rank 0) ------------------------------------------------------

    @property
    def is_driver(self) -> bool:
        return self.ctx.is_driver

    def train_step(self, groups: Sequence[Group]) -> dict[str, float]:
        """Train on ``groups`` (one rollout step) on every rank; bump ``policy_version``. Rank 0 only.

        Returns the torch backend's metrics (see ``TorchTrainer.train_step``) minus the critic's.
        Raises ValueError / RuntimeError from ``build_train_batch`` before any rank starts.
        """
        with self._lock:
            self._use_device()
            cfg = self.config
            batch = build_train_batch(
                groups,
                pad_token_id=self.pad_token_id,
                current_version=self.policy_version,
                normalize_advantages_by_std=not cfg.disable_grpo_std_normalization,
                max_staleness=self.max_staleness,
                advantage_estimator=cfg.advantage_estimator,
                mask_offpolicy_in_partial_rollout=cfg.mask_offpolicy_in_partial_rollout,
                use_opd=cfg.use_opd,
                use_task_reward=not cfg.opd_only,
            )
            self.channel.send("train", batch)
            return self._train_batch(batch)

    def save_hf(self, out_dir: str) -> str:
        """Write the current weights as an HF directory (rank 0 gathers, tensor by tensor); return its path."""
        with self._lock:
            self._use_device()
            self.channel.send("save_hf", out_dir)
            return write_hf_dir(iter_hf_weights(self.ddp, self.arch, self.ctx), out_dir, source_dir=self.model_dir)

    def state_dict_for_sync(self) -> dict[str, Tensor]:
        """The current weights keyed by HF name, fp32 on rank 0's CPU (gathered tensor by tensor)."""
        with self._lock:
            self._use_device()
            self.channel.send("gather")
            return dict(iter_hf_weights(self.ddp, self.arch, self.ctx, dtype=torch.float32))

    def close(self) -> None:
        """Release the worker ranks (rank 0) and tear down the process groups. Idempotent."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self.ctx.is_driver:
            self.channel.send("stop")
        self.ctx.close()

    # --- worker ranks -------------------------------------------------------------------------

    def serve(self) -> None:
        """Run rank 0's commands until "stop" (ranks other than 0)."""
        self._use_device()
        while True:
            command, payload = self.channel.recv()
            if command == "train":
                self._train_batch(payload)
            elif command == "save_hf":
                for _ in iter_hf_weights(self.ddp, self.arch, self.ctx):
                    pass
            elif command == "gather":
                for _ in iter_hf_weights(self.ddp, self.arch, self.ctx, dtype=torch.float32):
                    pass
            elif command == "stop":
                self.ctx.close()
                return
            else:
                raise RuntimeError(f"rank {self.ctx.rank}: unknown command {command!r} from rank 0")

    # --- one train step (every rank) ----------------------------------------------------------

    def _plan(self, batch: TrainBatch) -> list[tuple[int, int, list[PackedMicroBatch]]]:
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
                max_tokens_per_gpu=mcfg.max_tokens_per_gpu * self.ctx.cp_size if mcfg.use_dynamic_batch_size else None,  # CP ranks share a micro-batch
            )
            mbs = [self._pack(batch, [start + i for i in mb]) for mb in plan[self.ctx.dp_rank]]
            if self.ctx.ep_size > 1:
                busiest = max(len(p) for p in plan)
                mbs += [self._placeholder(batch) for _ in range(busiest - len(mbs))]
            steps.append((start, end, mbs))
        return steps

    def _pack(self, batch: TrainBatch, samples: list[int]) -> PackedMicroBatch:
        """Rows ``samples`` packed (this CP rank's share) on this rank's device."""
        c = self.ctx
        return pack_samples(
            batch, samples, pad_token_id=self.pad_token_id, pad_to=self.pad_to, head_dim=self.arch.head_dim, rope_theta=self.arch.rope_theta,
            cp_size=c.cp_size, cp_rank=c.cp_rank, cp_group=c.cp_group,
        ).to(c.device)  # fmt: skip

    def _placeholder(self, batch: TrainBatch) -> PackedMicroBatch:
        """A micro-batch of no sample (``pad_to`` pad tokens): this rank still joins the step's collectives."""
        return self._pack(batch, [])

    def _forward(self, model: Any, mb: PackedMicroBatch, *, entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
        """Logprobs and entropies [T] of ``mb`` under ``model`` (one pipeline stage), full packed order."""
        logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params)  # [1, t, v]
        return self._logprobs(logits, mb, entropy_grad=entropy_grad)

    def _logprobs(self, logits: Tensor, mb: PackedMicroBatch, *, entropy_grad: bool) -> tuple[Tensor, Tensor]:
        """[1, t, v] this rank's logits -> logprobs and entropies [T], gathered over CP (``PackedMicroBatch.full``)."""
        logprob, entropy = vocab_parallel_logprobs(
            logits[0],
            mb.labels[0],
            temperature=self.rollout_temperature,
            vocab_size=self.arch.vocab_size,
            tp_rank=self.ctx.tp_rank,
            group=self.ctx.tp_group if self.ctx.tp_size > 1 else None,
            entropy_grad=entropy_grad,
        )
        return mb.full(logprob), mb.full(entropy)

    def _pipeline(self, model: Any, mbs: list[PackedMicroBatch], loss_of: Any, *, forward_only: bool, entropy_grad: bool = False) -> None:
        """``mbs`` through megatron-core's pipeline schedule (1F1B; forward only for logprob passes).

        Stage 0 embeds, every stage runs its layers and exchanges activations (and their
        gradients) with its neighbours through megatron's P2P communication, shapes first
        (packed micro-batches differ in length: ``variable_seq_lengths``). On the last stage
        ``loss_of(i, logprob [T], entropy [T])`` returns micro-batch i's loss (already divided by
        the step's denominator; megatron's ``calculate_per_token_loss`` keeps it as is) and the
        schedule runs its backward. Gradient sync waits for the last micro-batch
        (``config.no_sync_func``); ``_optimizer_step`` finalizes the gradients.
        """
        schedule = mcore("megatron.core.pipeline_parallel").get_forward_backward_func()
        zero = torch.zeros((), dtype=torch.int, device=self.ctx.device)

        def forward_step(data_iterator: Any, stage: Any) -> tuple[Tensor, Any]:
            i = next(data_iterator)
            mb = mbs[i]
            out = stage(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params)

            def loss_func(logits: Tensor) -> tuple[Tensor, Tensor, dict]:
                logprob, entropy = self._logprobs(logits, mb, entropy_grad=entropy_grad)
                return loss_of(i, logprob, entropy), zero, {}

            return out, loss_func

        schedule(
            forward_step_func=forward_step, data_iterator=iter(range(len(mbs))), model=[model], num_microbatches=len(mbs),
            seq_length=max(mb.num_tokens for mb in mbs), micro_batch_size=1, forward_only=forward_only,
        )  # fmt: skip

    @torch.no_grad()
    def _before_update(self, batch: TrainBatch, steps: list) -> TrainBatch:
        """``old_logprobs`` (and ``ref_logprobs``) for every sample, computed on the micro-batches of training."""
        old = torch.zeros_like(batch.loss_mask, device=self.ctx.device)  # [B, L]
        ref = torch.zeros_like(old) if self.ref_model is not None else None
        self.model.eval()
        # Row indices go to the GPU before the first forward: a host-to-device copy from pageable
        # memory synchronises the stream, and one per micro-batch would stall the GPU until the
        # next forward's kernels are launched (no other host sync until ``old.cpu()`` below).
        keep_placeholders = self.ctx.ep_size > 1  # their forwards are part of the EP collectives (``_plan``)
        todo = [(mb, torch.as_tensor(mb.samples, device=self.ctx.device)) for _, _, mbs in steps for mb in mbs if mb.samples or keep_placeholders]
        for model, out in ((self.model, old), (self.ref_model, ref)):
            if model is None:
                continue
            if self.ctx.pp_size > 1:
                if todo:

                    def write(i: int, lp: Tensor, _: Tensor, out: Tensor = out) -> Tensor:
                        out[todo[i][1], : todo[i][0].num_cols] = todo[i][0].unpack(lp)
                        return lp.new_zeros(())

                    self._pipeline(model, [mb for mb, _ in todo], write, forward_only=True)
                continue
            for mb, rows in todo:
                lp = self._forward(model, mb)[0]
                if mb.samples:
                    out[rows, : mb.num_cols] = mb.unpack(lp)
        for t in (old, ref):
            if t is not None and self.ctx.dp_size > 1:
                dist.all_reduce(t, group=self.ctx.dp_group)  # each row was written by exactly one DP rank
            if t is not None and self.ctx.pp_size > 1:
                dist.broadcast(t, src=self.ctx.last_stage_rank, group=self.ctx.pp_group)  # computed on the last stage
        self.model.train()
        return _replace(batch, old_logprobs=old.cpu(), ref_logprobs=ref.cpu() if ref is not None else None)

    def _train_batch(self, batch: TrainBatch) -> dict[str, float]:
        t0 = time.perf_counter()
        cfg = self.config
        steps = self._plan(batch)
        if not objective.is_sft(cfg):  # --loss-type sft_loss needs no logprobs from before the update
            batch = objective.with_advantages(cfg, self._before_update(batch, steps))
        # Every micro-batch's rows go to the GPU now, while it is idle: selected on the CPU (no
        # index upload, no ``int(max)`` read back) and copied before the first forward, so the
        # loop below has no host sync between one micro-batch's backward and the next forward.
        subs = [[_to(select_samples(batch, mb.samples), self.ctx.device) if mb.samples else None for mb in mbs] for _, _, mbs in steps]
        sums = torch.zeros(len(_TOKEN_METRICS) + 1, dtype=torch.float64)  # token-weighted metric sums, then num_tokens
        seen: set[str] = set()
        losses, grad_norms, num_skipped = [], [], 0
        for (start, end, mbs), step_subs in zip(steps, subs):
            step_mask = batch.loss_mask[start:end]
            if step_mask.sum() == 0:
                continue  # same decision on every rank: the batch is identical everywhere
            denom = float(end - start) if cfg.loss_agg == "seq_mean" else float(step_mask.sum())
            if self.router_stats is not None:  # the aux loss is averaged over the step's tokens (module docstring)
                aux_scale = mcore("megatron.core.transformer.moe.moe_utils").MoEAuxLossAutoScaler
                sp = self.ctx.tp_size if self.tconfig.sequence_parallel else 1  # each TP rank scales by its T / tp tokens
                aux_scale.set_loss_scale(torch.tensor(sp / max(float(batch.seq_lens[start:end].sum()), 1.0), device=self.ctx.device))
            self.ddp.zero_grad_buffer()
            self.optimizer.zero_grad()
            step_loss = torch.zeros((), dtype=torch.float64, device=self.ctx.device)  # read back once, after the whole step
            if not mbs:
                mbs = [self._placeholder(batch)]
                step_subs = [None]

            def loss_of(mb: PackedMicroBatch, sub: TrainBatch | None, logprob: Tensor, entropy: Tensor, denom: float = denom, step_loss: Tensor = step_loss) -> Tensor:
                if sub is None:  # a DP rank without samples in this step still joins the gradient reduce
                    return logprob.sum() * 0.0
                loss, metrics = objective.micro_batch_loss(cfg, sub, mb.unpack(logprob), mb.unpack(entropy), denom)
                step_loss.add_(loss.detach())
                seen.update(k for k in _TOKEN_METRICS if k in metrics)
                for k, key in enumerate(_TOKEN_METRICS):
                    sums[k] += metrics.get(key, 0.0) * metrics["num_tokens"]
                sums[-1] += metrics["num_tokens"]
                return loss

            entropy_grad = cfg.entropy_coef != 0.0
            if self.ctx.pp_size > 1:
                self._pipeline(self.ddp, mbs, lambda i, lp, ent: loss_of(mbs[i], step_subs[i], lp, ent), forward_only=False, entropy_grad=entropy_grad)
            else:
                for i, (mb, sub) in enumerate(zip(mbs, step_subs)):
                    sync = contextlib.nullcontext() if i == len(mbs) - 1 else self.ddp.no_sync()
                    with sync:
                        loss_of(mb, sub, *self._forward(self.ddp, mb, entropy_grad=entropy_grad)).backward()
            grad_norm = self._optimizer_step()
            if not math.isfinite(grad_norm):
                num_skipped += 1
                log.warning("skipping optimizer step: grad_norm=%s at policy_version %d", grad_norm, self.policy_version)
            losses.append(step_loss)
            grad_norms.append(grad_norm)
        self.policy_version += 1
        losses_t = torch.stack(losses) if losses else torch.zeros(0, dtype=torch.float64, device=self.ctx.device)
        if self.ctx.dp_size > 1 or self.ctx.pp_size > 1:
            both = torch.cat([sums.to(self.ctx.device), losses_t])
            if self.ctx.dp_size > 1:
                dist.all_reduce(both, group=self.ctx.dp_group)
            if self.ctx.pp_size > 1:  # losses and metrics live on the last stage; rank 0 (stage 0) reports them
                dist.broadcast(both, src=self.ctx.last_stage_rank, group=self.ctx.pp_group)
            sums, losses_t = both[: len(sums)], both[len(sums) :]
        sums, losses_t = sums.cpu(), losses_t.cpu()
        router = self._router_metrics()
        num_tokens = max(float(sums[-1]), 1.0)
        always = 0 if objective.is_sft(cfg) else 4
        out = {key: float(sums[k]) / num_tokens for k, key in enumerate(_TOKEN_METRICS) if key in seen or k < always}
        out.update(_batch_metrics(batch))
        out.update(objective.opd_metrics(batch))
        out.update(router)
        out.update(
            loss=float(losses_t.mean()) if len(losses_t) else 0.0,
            grad_norm=sum(grad_norms) / max(len(grad_norms), 1),
            num_optimizer_steps=float(len(losses)),
            num_skipped_steps=float(num_skipped),
            policy_version=float(self.policy_version),
            lr=float(self.scheduler.get_lr({})),
            train_time_s=time.perf_counter() - t0,
        )
        return out

    def _router_metrics(self) -> dict[str, float]:
        """This step's router metrics (MoE models; every rank, collectively), {} for a dense model."""
        if self.router_stats is None:
            return {}
        groups = [self.ctx.dp_group]  # under sequence parallelism the hooks already summed over TP
        mcore("megatron.core.transformer.moe.moe_utils").clear_aux_losses_tracker()  # megatron's own copy, unused here
        return self.router_stats.collect(groups=groups)

    def _optimizer_step(self) -> float:
        """Reduce gradients, then step unless the gradient norm is not finite; returns the norm before clipping.

        Mirrors megatron's ``ChainedOptimizer.step`` (prepare, norm, clip, step) with one
        difference: a non-finite norm skips the update (bf16 has no loss scaler to do it).
        """
        mcore("megatron.core.distributed").finalize_model_grads([self.ddp], num_tokens=None)
        opt = self.optimizer
        if opt.prepare_grads():
            return float("nan")
        grad_norm = float(opt.get_grad_norm())
        if not math.isfinite(grad_norm):
            return grad_norm
        if self.config.clip_grad > 0:
            clip = mcore("megatron.core.optimizer.clip_grads").clip_grad_by_total_norm_fp32
            for o in getattr(opt, "chained_optimizers", [opt]):
                params = o.get_parameters()
                if params:
                    clip(params, max_norm=self.config.clip_grad, total_norm=grad_norm, use_decoupled_grad=o.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8)
        opt.step_with_ready_grads()
        self.scheduler.step(increment=1)
        return grad_norm


def _fuse_torch_adam(optimizer: Any) -> None:
    """Switch megatron's torch ``AdamW`` (its fallback without Transformer Engine or Apex, built with
    the multi-tensor "foreach" kernels, about ten passes over the fp32 state) to torch's fused
    single-kernel AdamW when every parameter is on CUDA. Same update; set before the first step,
    while the optimizer state (and its step counters) is still empty."""
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(o, "optimizer", None)
        if not isinstance(inner, torch.optim.AdamW) or inner.state:
            continue
        params = [p for g in inner.param_groups for p in g["params"]]
        if params and all(p.is_cuda and p.is_floating_point() for p in params):
            for g in inner.param_groups:
                g["foreach"], g["fused"] = False, True


def _replace(batch: TrainBatch, **fields: Any) -> TrainBatch:
    return dataclasses.replace(batch, **fields)


def _to(batch: TrainBatch, device: torch.device) -> TrainBatch:
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(batch) if getattr(batch, f.name) is not None})


def _batch_metrics(batch: TrainBatch) -> dict[str, float]:
    n = batch.num_train_tokens
    if batch.old_logprobs is None:  # --loss-type sft_loss
        return {"num_samples": float(batch.num_samples), "num_train_tokens": float(n)}
    return rl_batch_metrics(batch)


def serve_if_worker(config: TrainConfig, *, model_dir: str, **trainer_kwargs: Any) -> bool:
    """On a torchrun rank other than 0: build the trainer, serve rank 0 until "stop", return True.

    On rank 0 (or without torchrun) return False at once: the caller builds the trainer and runs
    the driver.
    ``trainer_kwargs``: ``MegatronTrainer``'s keyword arguments, the same on every rank.
    """
    if int(os.environ.get("RANK", "0")) == 0:
        return False
    MegatronTrainer(config, model_dir=model_dir, **trainer_kwargs).serve()
    return True
