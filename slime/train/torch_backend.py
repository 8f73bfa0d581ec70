"""The torch training backend: one HF causal LM, updated with an RL objective on the CPU or one GPU.

``train_step`` is plain blocking code: the loop calls it through ``asyncio.to_thread`` so the event
loop keeps generating while it runs. One call is one rollout step (slime's ``train`` on one
rollout): it may hold several optimizer steps.

    groups ─► build_train_batch (sample scores, masks, staleness check)
           ─► before the update, in the micro-batches of training (no grad): old_logprobs;
              ref_logprobs (frozen reference, with a KL term); old values (critic, with PPO)
           ─► objective.with_advantages (REINFORCE++, PPO/GAE, whitening)
           ─► for each optimizer step of ``global_batch_size`` samples:
                  lr from slime.train.lr_schedule (--lr-warmup-iters, --lr-decay-style, ...)
                  for each micro-batch of ``micro_batch_size`` samples (or, with
                      --use-dynamic-batch-size, of at most --max-tokens-per-gpu padded tokens):
                      forward, objective.micro_batch_loss (+ critic value_loss), backward
                  clip_grad_norm_(clip_grad), AdamW step (policy; critic alongside)
           ─► policy_version += 1, metrics

With ``--loss-type sft_loss`` the step skips the no-grad pass (nothing needs old logprobs) and the
loss is the masked NLL (``losses.sft_loss``); ``eval_loss`` scores held-out rows the same way.

The algorithm (estimator, clips, off-policy correction, KL, entropy) comes from ``TrainConfig``
only; ``slime.train.objective`` maps it onto the loss functions. The reference model is a frozen
copy of ``ref_load`` (default: ``model_dir``, the initial checkpoint); the critic is described in
``slime.train.critic``.

Example: rollout_batch_size 4 groups x n 8 = 32 samples, global_batch_size 16, micro_batch_size 4
-> 2 optimizer steps of 4 micro-batches each. The first step is on-policy (ratio exactly 1, since
``old_logprobs`` come from the same weights, inputs and micro-batches); the second is off by one
update, which is what the PPO clip is for. If the sample count is not a multiple of
``global_batch_size`` the last optimizer step takes the remainder.

Device and precision (``--train-device``, ``--bf16``): ``slime.train.torch_device``. The forward passes
(before the update, and each micro-batch's losses): ``slime.train.torch_forward``.

Deviations from slime: dropout is off (``model.eval()``) so that the first optimizer step sees ratio
1 exactly; an optimizer step whose gradient norm is not finite is skipped and counted
(``num_skipped_steps``), as megatron does; an optimizer step with no trainable token is skipped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel

from slime.config import TrainConfig
from slime.hf_checkpoint import check_hf_dir
from slime.sync.hf_layout import checkpoint_views
from slime.train import objective
from slime.train.advantages import GROUP_NORMALISED
from slime.train.batch import MicroBatch, Step, TrainBatch, build_train_batch, plan_steps, rl_batch_metrics
from slime.train.checkpoint import save_hf_dir
from slime.train.critic import ValueModel, explained_variance
from slime.train.determinism import enable_deterministic_mode
from slime.train.logprobs import compute_token_logprobs
from slime.train.losses import LossAgg, loss_denominator
from slime.train.lr_schedule import lr_at
from slime.train.router_metrics import RouterStats, attach_hf_routers
from slime.train.tally import TOKEN_METRICS, StepTally
from slime.train.torch_device import adamw, load_causal_lm, resolve_device
from slime.train.torch_forward import TorchForward
from slime.train_metrics import TrainMetrics
from slime.types import Group

__all__ = ["TorchTrainer"]

logger = logging.getLogger(__name__)


class TorchTrainer:
    """Holds the policy model and its AdamW state (plus a frozen reference and a critic when the
    config asks for them); trains on rewarded groups.

    Args:
        config: the ``train`` config section.
        model_dir: HF model directory (config.json + safetensors, tokenizer files optional).
        policy_version: the version of the weights in ``model_dir`` (0 for a fresh run).
        rollout_temperature: the engines' sampling temperature (``RolloutConfig.rollout_temperature``): logits
            are divided by it before log_softmax, as SGLang does for returned logprobs.
        max_staleness: refuse a batch with a trainable token more versions behind than this
            (``LoopConfig.max_staleness``); None = no check.
        seed: the run's seed (``Config.seed``), for torch and ``--deterministic-mode``.

    Not thread-safe by design, but guarded: ``train_step``, ``save_hf`` and
    ``state_dict_for_sync`` take one lock, so a concurrent call waits instead of reading
    half-updated weights. Sets the process-wide torch thread count and seed.

    Raises:
        RuntimeError: ``--train-device cuda`` where torch sees no CUDA device.
    """

    config: TrainConfig
    model_dir: str
    model: PreTrainedModel
    optimizer: torch.optim.AdamW
    ref_model: PreTrainedModel | None
    critic: ValueModel | None
    critic_optimizer: torch.optim.AdamW | None
    router_stats: RouterStats | None
    policy_version: int
    num_optimizer_steps: int
    """Optimizer steps taken so far (skipped ones included): the index into the lr schedule; checkpointed."""
    pad_token_id: int
    loss_agg: LossAgg
    device: torch.device
    """Where the models, the optimizer state and the step's tensors live (``resolve_device``)."""
    bf16: bool
    """Forward and backward under bf16 autocast (``--bf16``); weights stay fp32."""
    forward: TorchForward
    """The forward passes over these models (before the update; each micro-batch's losses)."""

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
        self.config = config
        self.rollout_temperature, self.max_staleness = rollout_temperature, max_staleness
        self.model_dir = model_dir
        self.policy_version = policy_version
        self.num_optimizer_steps = 0
        self.loss_agg = config.loss_agg
        self._lock = threading.Lock()
        torch.set_num_threads(config.num_threads)
        torch.manual_seed(seed)
        if config.deterministic_mode:
            enable_deterministic_mode(seed)
        self.device = resolve_device(config.device)
        self.bf16 = config.megatron.bf16
        check_hf_dir(model_dir)
        self.model = load_causal_lm(model_dir, self.device)
        self.model.eval()  # dropout off: old_logprobs and the first step's logprobs match exactly
        pad = getattr(self.model.config, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else 0
        self.optimizer = adamw(self.model.parameters(), config, config.lr, self.device)
        self.router_stats = attach_hf_routers(self.model)  # MoE models: per-step router metrics (moe_*)
        self.ref_model = self.critic = self.critic_optimizer = None
        if objective.needs_reference(config):
            check_hf_dir(config.ref_load or model_dir)
            self.ref_model = load_causal_lm(config.ref_load or model_dir, self.device)
            self.ref_model.eval().requires_grad_(False)
        if objective.needs_critic(config):
            self.critic = ValueModel.from_pretrained(model_dir).to(self.device)
            self.critic_optimizer = adamw(self.critic.parameters(), config, config.critic_lr or config.lr, self.device)
        self.forward = TorchForward(
            config, model=self.model, ref_model=self.ref_model, critic=self.critic, router_stats=self.router_stats,
            rollout_temperature=rollout_temperature, device=self.device, bf16=self.bf16,
        )  # fmt: skip
        if config.kl_coef != 0.0 and config.advantage_estimator in GROUP_NORMALISED:
            logger.warning(
                "--kl-coef=%s has no effect with --advantage-estimator %s (as in slime)",
                config.kl_coef,
                config.advantage_estimator,
            )
        if config.behav_imp_weight_cap is not None and not config.use_decoupled_ppo:
            logger.warning("--behav-imp-weight-cap has no effect without --use-decoupled-ppo")
        logger.info(
            "torch backend: %s, %s, sdpa attention", self.device, "bf16 autocast, fp32 weights" if self.bf16 else "fp32"
        )

    def train_step(self, groups: Sequence[Group]) -> TrainMetrics:
        """Train on ``groups`` (one rollout step) and bump ``policy_version`` by one.

        Args:
            groups: rewarded groups; samples FAILED or fully masked add no loss.

        Returns:
            ``TrainMetrics`` (floats; the fields a step does not have are None): ``loss`` (mean over optimizer steps), ``grad_norm`` (mean, before
            clipping), ``pg_clipfrac``, ``approx_kl``, ``ratio_mean``, ``entropy`` (token means),
            the active correction's token means (``tis_mean``/``tis_clipfrac``, ``mis_*``,
            ``behav_*``), ``dual_clipfrac`` (dual clip), ``kl_loss`` (KL loss, token mean),
            ``value_loss`` / ``value_clipfrac`` / ``critic_grad_norm`` / ``explained_variance``
            (PPO critic; explained variance of the returns by the values before the update),
            ``train_rollout_logprob_abs_diff`` (mean |old_logp - rollout_logp| over trained
            tokens), ``reward_mean``, ``advantage_abs_mean``, ``staleness_mean`` /
            ``staleness_max`` (versions, trained tokens), ``num_samples``, ``num_train_tokens``,
            ``num_optimizer_steps``, ``num_skipped_steps``, ``lr`` (of the last optimizer step),
            ``policy_version`` (after the step), ``train_time_s``. With ``sft_loss``: ``loss``,
            ``nll`` (token mean), ``grad_norm``, ``lr``, ``num_samples``, ``num_train_tokens``,
            ``num_tokens`` and the step counts; none of the RL metrics;
            for an MoE model the router metrics ``moe_*`` of ``slime.train.router_metrics`` (padding
            excluded).

        Raises:
            ValueError / RuntimeError: from ``build_train_batch`` (bad sample, stale token).
        """
        with self._lock:
            return self._train_step(groups)

    def _train_step(self, groups: Sequence[Group]) -> TrainMetrics:
        t0 = time.perf_counter()
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
        ).to(self.device)
        steps = self._plan(batch.seq_lens.tolist())
        if not objective.is_sft(cfg):  # SFT needs no logprobs from before the update
            batch = objective.with_advantages(
                cfg, self.forward.before_update(batch, [mb for step in steps for mb in step])
            )
        tally = StepTally()
        for step in steps:
            self._optimizer_step(batch, step, tally)
        self.policy_version += 1
        return self._step_metrics(batch, tally, t0)

    def _optimizer_step(self, batch: TrainBatch, step: Step, tally: StepTally) -> None:
        """One optimizer step over the micro-batches ``step`` (skipped when none of its tokens trains)."""
        rows = [i for mb in step for i in mb]
        step_mask = batch.loss_mask[rows]  # [S, L]
        if step_mask.sum() == 0:
            return
        denom = loss_denominator(step_mask, self.loss_agg)  # a fully masked sample is in no denominator
        self._zero_grad()
        tally.lrs.append(self._set_lr())
        step_loss, step_value_loss = self._backward(batch, step, denom, tally)
        grad_norm = self._clip_and_step(self.model, self.optimizer)
        self.num_optimizer_steps += 1
        if not math.isfinite(grad_norm):
            tally.num_skipped += 1
            logger.warning("skipping optimizer step: grad_norm=%s at policy_version %d", grad_norm, self.policy_version)
        if self.critic is not None:
            assert self.critic_optimizer is not None  # __init__ builds it with the critic
            tally.critic_norms.append(self._clip_and_step(self.critic, self.critic_optimizer))
            tally.value_losses.append(step_value_loss)
        self._zero_grad()
        tally.losses.append(step_loss)
        tally.grad_norms.append(grad_norm)

    def _backward(self, batch: TrainBatch, step: Step, denom: float, tally: StepTally) -> tuple[float, float]:
        """Forward and backward of each micro-batch of ``step`` (policy, then critic); the summed
        policy and value losses of the step. Token metrics go into ``tally``."""
        step_loss = step_value_loss = 0.0
        for indices in step:
            mb = batch.select(indices)
            loss, metrics = self.forward.micro_batch_loss(mb, denom)
            loss.backward()
            step_loss += float(loss.detach())
            if self.critic is not None:
                v_loss, v_metrics = self.forward.value_loss(mb, denom)
                v_loss.backward()
                step_value_loss += float(v_loss.detach())
                metrics.update(v_metrics)
            tally.add(metrics)
        return step_loss, step_value_loss

    def _step_metrics(self, batch: TrainBatch, tally: StepTally, t0: float) -> TrainMetrics:
        """The step's ``TrainMetrics`` (``train_step``'s docstring); ``t0``: when the step started."""
        always = () if objective.is_sft(self.config) else TOKEN_METRICS[:4]
        out = tally.token_means(always)
        out.update(self._batch_metrics(batch))
        out.update(objective.opd_metrics(batch))
        if self.router_stats is not None:
            out.update(self.router_stats.collect(groups=[]))
        if self.critic is not None:
            assert batch.returns is not None and batch.old_values is not None
            out["value_loss"] = _mean(tally.value_losses)
            out["critic_grad_norm"] = _mean(tally.critic_norms)
            out["explained_variance"] = explained_variance(batch.returns, batch.old_values, batch.loss_mask)
        out.update(
            loss=_mean(tally.losses),
            grad_norm=_mean(tally.grad_norms),
            num_optimizer_steps=float(len(tally.losses)),
            lr=tally.lrs[-1] if tally.lrs else self._lr(),
            num_skipped_steps=float(tally.num_skipped),
            policy_version=float(self.policy_version),
            train_time_s=time.perf_counter() - t0,
        )
        return TrainMetrics.from_dict(out)

    def _before_update(self, batch: TrainBatch, micro_batches: list[MicroBatch]) -> TrainBatch:
        """``TorchForward.before_update`` (the bench times it alone, as the megatron backend's)."""
        return self.forward.before_update(batch, micro_batches)

    def _plan(self, seq_lens: list[int]) -> list[Step]:
        """Optimizer steps of ``global_batch_size`` samples (in batch order), each a list of micro-batches.

        A micro-batch is ``micro_batch_size`` consecutive samples, or, with ``--use-dynamic-batch-size``,
        a padded pack of at most ``--max-tokens-per-gpu`` tokens (``pack_by_token_budget``).
        """
        m = self.config.megatron
        return plan_steps(
            seq_lens,
            global_batch_size=self.config.global_batch_size,
            micro_batch_size=self.config.micro_batch_size,
            max_tokens_per_gpu=m.max_tokens_per_gpu if m.use_dynamic_batch_size else None,
        )

    def _lr(self) -> float:
        return lr_at(self.config, self.num_optimizer_steps)

    def _set_lr(self) -> float:
        """Set the lr of the coming optimizer step (``slime.train.lr_schedule``) on every param group; return it."""
        lr = self._lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    @torch.no_grad()
    def eval_loss(self, groups: Sequence[Group]) -> dict[str, float]:
        """Mean NLL per loss-mask token of ``groups`` under the current weights (no update).

        Micro-batches as in training. Every token weighs the same, whatever ``loss_agg`` says, so
        the number is comparable across runs and batch sizes.

        Returns:
            ``eval_loss`` (nats per token), ``eval_tokens`` (tokens scored), ``eval_samples``.
        """
        with self._lock:
            batch = build_train_batch(groups, pad_token_id=self.pad_token_id, current_version=self.policy_version).to(
                self.device
            )
            total = torch.zeros((), dtype=torch.float64, device=self.device)  # one host sync at the end
            for step in self._plan(batch.seq_lens.tolist()):
                for indices in step:
                    mb = batch.select(indices)
                    with self.forward.autocast():
                        logprobs = compute_token_logprobs(
                            self.model, mb.input_ids, mb.attention_mask, temperature=self.rollout_temperature
                        )  # [b, l]
                    total += -(logprobs * mb.loss_mask).sum()
            loss_sum = float(total)
            num_tokens = batch.num_train_tokens
            return {
                "eval_loss": loss_sum / max(num_tokens, 1),
                "eval_tokens": float(num_tokens),
                "eval_samples": float(batch.num_samples),
            }

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)

    def _clip_and_step(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        """Clip the gradient norm to ``clip_grad`` (0 = off) and step unless the norm is not finite."""
        max_norm = self.config.clip_grad if self.config.clip_grad > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm))
        if math.isfinite(grad_norm):
            optimizer.step()
        return grad_norm

    def _batch_metrics(self, batch: TrainBatch) -> dict[str, float]:
        num_train_tokens = batch.num_train_tokens
        if objective.is_sft(self.config):
            return {
                "num_samples": float(batch.num_samples),
                "num_train_tokens": float(num_train_tokens),
                "num_tokens": float(batch.seq_lens.sum()),
            }
        return rl_batch_metrics(batch, measured_mismatch=not self.config.use_rollout_logprobs)

    def save_hf(self, out_dir: str) -> str:
        """Write the current weights as an HF model directory, atomically; return its path.

        See ``slime.train.checkpoint.save_hf_dir`` (tokenizer files come from ``model_dir``).
        Only the policy is saved, not the reference model or the critic.
        """
        return save_hf_dir(self.model, out_dir, source_dir=self.model_dir, lock=self._lock)

    def state_dict_for_sync(self) -> dict[str, Tensor]:
        """A copy of the weights, keyed by HF checkpoint name (fp32, CPU, whatever ``device`` and
        ``--bf16`` are, as the megatron backend's), safe to read while training.

        Checkpoint names are what ``save_pretrained`` writes and SGLang loads: an MoE model's fused
        in-memory experts go out as one tensor per expert (``slime.sync.hf_layout``).
        """
        with self._lock:
            return {
                name: t.detach().to("cpu", torch.float32, copy=True)
                for name, t in checkpoint_views(self.model.state_dict()).items()
            }


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)
