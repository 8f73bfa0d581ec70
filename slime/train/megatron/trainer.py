"""The megatron-core training backend: ``MegatronTrainer``, with ``TorchTrainer``'s interface.

Every torchrun rank builds one (collectively); rank 0 is the driver, the others call ``serve``
(``slime.train.megatron.parallel`` describes the command channel). What one ``train_step`` does on
every rank (plan, old logprobs, forward/backward over packed micro-batches, optimizer step, and
the loss scale under DP, CP, PP and the MoE load-balancing loss): ``slime.train.megatron.step``.
This module builds the model, DDP, optimizer and lr schedule, and is the driver's interface.

Not covered (raise at construction): the PPO critic (``--advantage-estimator ppo|gae``), CP or PP
for MoE models, ``--logprob-impl liger`` under TP or without liger-kernel, and running without CUDA (megatron-core's optimizer and DDP
allocate on the GPU; use ``--train-backend torch`` on a CPU).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from slime.config import TrainConfig
from slime.routed_experts import stack_routes
from slime.train import objective
from slime.train.batch import TrainBatch, build_train_batch
from slime.train.determinism import enable_deterministic_mode
from slime.train.megatron._mcore import mcore
from slime.train.megatron.arch import ModelArch, load_hf_config
from slime.train.megatron.float16 import wrap_float16
from slime.train.megatron.logprobs import check_logprob_impl
from slime.train.megatron.model import (
    HFCheckpointReader,
    build_gpt_model,
    load_hf_weights,
    output_hidden_states,
    transformer_config,
)
from slime.train.megatron.multi_tensor import use_foreach_multi_tensor_ops
from slime.train.megatron.packing import PackedMicroBatch
from slime.train.megatron.parallel import ControlChannel, ParallelContext, init_parallel
from slime.train.megatron.router_metrics import attach_megatron_routers
from slime.train.megatron.step import MegatronTrainStep
from slime.train.megatron.weights import iter_hf_weights, write_hf_dir
from slime.train_metrics import TrainMetrics
from slime.types import Group

if TYPE_CHECKING:  # megatron-core ships no type information: these name its classes (mypy reads them as Any)
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

__all__ = ["MegatronTrainer", "serve_if_worker"]

log = logging.getLogger(__name__)


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

    model: torch.nn.Module
    """This pipeline stage's GPTModel (bf16-wrapped with ``--bf16``)."""
    ddp: DistributedDataParallel
    step: MegatronTrainStep
    """The train step every rank runs, over these models (``slime.train.megatron.step``)."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        model_dir: str,
        policy_version: int = 0,
        rollout_temperature: float = 1.0,
        max_staleness: int | None = None,
        seed: int = 1234,
    ):
        _check_supported(config)
        mcfg = config.megatron
        self.config = config
        self.rollout_temperature, self.max_staleness = rollout_temperature, max_staleness
        self.model_dir = model_dir
        self.policy_version = policy_version
        self._lock = threading.Lock()
        if config.deterministic_mode:
            enable_deterministic_mode(seed)
        self.arch = ModelArch.from_hf_config(load_hf_config(model_dir))
        self.tconfig = transformer_config(self.arch, mcfg)  # validates parallel sizes before any group exists
        self.ctx: ParallelContext = init_parallel(mcfg, seed=seed)
        check_logprob_impl(
            mcfg.logprob_impl,
            tensor_model_parallel_size=mcfg.tensor_model_parallel_size,
            bf16=mcfg.bf16,
            device=self.ctx.device,
        )
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
            self.router_stats = attach_megatron_routers(
                self.model,
                num_experts=self.arch.num_experts,
                topk=self.arch.moe_router_topk,
                device=self.ctx.device,
                tp_group=sp_group,
            )
        self.step = self._new_step()
        self._log_layout()

    def _new_step(self, cls: type[MegatronTrainStep] = MegatronTrainStep) -> MegatronTrainStep:
        """The train step over this trainer's models, optimizer and parallel context."""
        return cls(
            self.config, arch=self.arch, ctx=self.ctx, tconfig=self.tconfig, model=self.model, ddp=self.ddp, ref_model=self.ref_model,
            optimizer=self.optimizer, scheduler=self.scheduler, router_stats=self.router_stats, pad_token_id=self.pad_token_id,
            pad_to=self.pad_to, rollout_temperature=self.rollout_temperature,
        )  # fmt: skip

    def _train_batch(self, batch: TrainBatch) -> TrainMetrics:
        """``MegatronTrainStep.train_batch`` on every rank; then this trainer holds the next version."""
        metrics = self.step.train_batch(batch, policy_version=self.policy_version)
        self.policy_version += 1
        return metrics

    def _plan(self, batch: TrainBatch) -> list[tuple[int, int, list[PackedMicroBatch]]]:
        """``MegatronTrainStep.plan`` (the bench and the parity checks call it)."""
        return self.step.plan(batch)

    def _before_update(self, batch: TrainBatch, steps: list) -> TrainBatch:
        """``MegatronTrainStep.before_update`` (the bench and the parity checks time it alone)."""
        return self.step.before_update(batch, steps)

    def _log_layout(self) -> None:
        """One log line: the model, the parallel sizes, precision and packing."""
        mcfg, arch, c = self.config.megatron, self.arch, self.ctx
        moe = (
            f" ({sum(arch.moe_layers)} MoE: {arch.num_experts} experts, top-{arch.moe_router_topk})"
            if arch.is_moe
            else ""
        )
        packing = (
            f"{mcfg.max_tokens_per_gpu} tokens"
            if mcfg.use_dynamic_batch_size
            else f"{self.config.micro_batch_size} samples"
        )
        log.info(
            "megatron backend: %s, %d layers%s, TP=%d CP=%d PP=%d DP=%d EP=%d ETP=%d, bf16=%s, sequence_parallel=%s, packing=%s",
            arch.family, arch.num_layers, moe, c.tp_size, c.cp_size, c.pp_size, c.dp_size, c.ep_size, c.etp_size,
            mcfg.bf16, self.tconfig.sequence_parallel, packing,
        )  # fmt: skip

    # --- construction -------------------------------------------------------------------------

    def _build(self, hf_dir: str, *, trainable: bool) -> tuple[torch.nn.Module, DistributedDataParallel | None]:
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
        if self.config.megatron.logprob_impl == "liger":
            output_hidden_states(model)  # the model returns hidden states; logprobs come from liger (step.py)
        if self.tconfig.bf16:
            model = wrap_float16(model, self.tconfig)
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

    def _optimizer(self) -> MegatronOptimizer:
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
        use_foreach_multi_tensor_ops()  # megatron's local grad-norm fallback syncs the host once per parameter
        optimizer = opt.get_megatron_optimizer(opt_config, [self.ddp])
        _fuse_torch_adam(optimizer)
        return optimizer

    def _scheduler(self) -> OptimizerParamScheduler:
        cfg, mcfg = self.config, self.config.megatron
        if mcfg.lr_decay_style != "constant" and mcfg.lr_decay_iters is None:
            raise ValueError(
                f"--lr-decay-style {mcfg.lr_decay_style} needs --lr-decay-iters (optimizer steps to decay over)"
            )
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

    def train_step(self, groups: Sequence[Group]) -> TrainMetrics:
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
            # the engine's MoE routes (--use-rollout-routing-replay), rows in the batch's order (valid samples)
            valid = [s for g in groups for s in g.samples if s.is_valid]
            batch = dataclasses.replace(batch, routed_experts=stack_routes(valid, batch.loss_mask.shape[1]))
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
                assert isinstance(payload, TrainBatch), type(payload)  # rank 0 sends the batch with "train"
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


def _check_supported(config: TrainConfig) -> None:
    """Raise for what the megatron backend does not run: a ``--logprob-impl`` its settings exclude,
    no CUDA device (RuntimeError), an estimator that needs a critic (ValueError)."""
    mcfg = config.megatron
    check_logprob_impl(mcfg.logprob_impl, tensor_model_parallel_size=mcfg.tensor_model_parallel_size, bf16=mcfg.bf16)
    if not torch.cuda.is_available():
        raise RuntimeError(
            "--train-backend megatron needs CUDA (megatron-core's optimizer and DDP allocate on the GPU); use --train-backend torch on a CPU"
        )
    if objective.needs_critic(config):
        raise ValueError(
            f"--advantage-estimator {config.advantage_estimator} needs a critic, which the megatron backend does not have yet; use --train-backend torch"
        )


def _fuse_torch_adam(optimizer: MegatronOptimizer) -> None:
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


def serve_if_worker(
    config: TrainConfig, *, model_dir: str, **trainer_kwargs: Any
) -> bool:  # Any: MegatronTrainer's keywords
    """On a torchrun rank other than 0: build the trainer, serve rank 0 until "stop", return True.

    On rank 0 (or without torchrun) return False at once: the caller builds the trainer and runs
    the driver.
    ``trainer_kwargs``: ``MegatronTrainer``'s keyword arguments, the same on every rank.
    """
    if int(os.environ.get("RANK", "0")) == 0:
        return False
    MegatronTrainer(config, model_dir=model_dir, **trainer_kwargs).serve()
    return True
