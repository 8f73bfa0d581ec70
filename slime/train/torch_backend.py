"""The torch training backend: one HF causal LM, fp32, updated with GRPO + PPO clipping on CPU.

``train_step`` is plain blocking code: the loop calls it through ``asyncio.to_thread`` so the event
loop keeps generating while it runs. One call is one rollout step (slime's ``train`` on one
rollout): it may hold several optimizer steps.

    groups ─► build_train_batch (GRPO advantages, masks, staleness check)
           ─► old_logprobs with the current weights (no grad, same micro-batches as training)
           ─► for each optimizer step of ``global_batch_size`` samples:
                  for each micro-batch of ``micro_batch_size`` samples: forward, policy_loss, backward
                  clip_grad_norm_(clip_grad), AdamW step
           ─► policy_version += 1, metrics

Example: rollout_batch_size 4 groups x n 8 = 32 samples, global_batch_size 16, micro_batch_size 4
-> 2 optimizer steps of 4 micro-batches each. The first step is on-policy (ratio exactly 1, since
``old_logprobs`` come from the same weights, inputs and micro-batches); the second is off by one
update, which is what the PPO clip is for. If the sample count is not a multiple of
``global_batch_size`` the last optimizer step takes the remainder.

Deviations from slime: dropout is off (``model.eval()``) so that the first optimizer step sees ratio
1 exactly; an optimizer step whose gradient norm is not finite is skipped and counted
(``num_skipped_steps``), as megatron does; an optimizer step with no trainable token is skipped.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import threading
import time
from typing import Sequence

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, PreTrainedModel

from slime.config import TrainConfig
from slime.train.batch import TrainBatch, build_train_batch
from slime.train.logprobs import compute_token_logprobs, compute_token_logprobs_and_entropy
from slime.train.losses import LossAgg, policy_loss
from slime.types import Group

__all__ = ["TorchTrainer", "TOKENIZER_FILES"]

logger = logging.getLogger(__name__)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
"""Files copied from the source model directory into every ``save_hf`` output, when present."""

_TOKEN_METRICS = ("pg_clipfrac", "approx_kl", "ratio_mean", "entropy", "tis_mean", "tis_clipfrac")

Span = tuple[int, int]  # [start, end) sample indices of one micro-batch


class TorchTrainer:
    """Holds the policy model and its AdamW state; trains on rewarded groups.

    Args:
        config: the ``train`` config section.
        model_dir: HF model directory (config.json + safetensors, tokenizer files optional).
        policy_version: the version of the weights in ``model_dir`` (0 for a fresh run).

    Not thread-safe by design, but guarded: ``train_step``, ``save_hf`` and
    ``state_dict_for_sync`` take one lock, so a concurrent call waits instead of reading
    half-updated weights. Sets the process-wide torch thread count and seed.
    """

    config: TrainConfig
    model_dir: str
    model: PreTrainedModel
    optimizer: torch.optim.AdamW
    policy_version: int
    pad_token_id: int
    loss_agg: LossAgg

    def __init__(self, config: TrainConfig, *, model_dir: str, policy_version: int = 0):
        self.config = config
        self.model_dir = model_dir
        self.policy_version = policy_version
        self.loss_agg = config.loss_agg
        self._lock = threading.Lock()
        torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()  # dropout off: old_logprobs and the first step's logprobs match exactly
        pad = getattr(self.model.config, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else 0
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.weight_decay,
        )

    def train_step(self, groups: Sequence[Group]) -> dict[str, float]:
        """Train on ``groups`` (one rollout step) and bump ``policy_version`` by one.

        Args:
            groups: rewarded groups; samples FAILED or fully masked add no loss.

        Returns:
            Metrics (floats): ``loss`` (mean over optimizer steps), ``grad_norm`` (mean, before
            clipping), ``pg_clipfrac``, ``approx_kl``, ``ratio_mean``, ``entropy`` (token means),
            ``tis_mean`` and ``tis_clipfrac`` (with ``use_tis``), ``train_rollout_logprob_abs_diff``
            (mean |old_logp - rollout_logp| over trained tokens), ``reward_mean``,
            ``advantage_abs_mean``, ``staleness_mean`` / ``staleness_max`` (versions, trained
            tokens), ``num_samples``, ``num_train_tokens``, ``num_optimizer_steps``,
            ``num_skipped_steps``, ``policy_version`` (after the step), ``train_time_s``.

        Raises:
            ValueError / RuntimeError: from ``build_train_batch`` (bad sample, stale token).
        """
        with self._lock:
            return self._train_step(groups)

    def _train_step(self, groups: Sequence[Group]) -> dict[str, float]:
        t0 = time.perf_counter()
        cfg = self.config
        batch = build_train_batch(
            groups,
            pad_token_id=self.pad_token_id,
            current_version=self.policy_version,
            normalize_advantages_by_std=cfg.normalize_advantages_by_std,
            max_staleness=cfg.max_staleness,
        )
        steps = self._plan(batch.num_samples)
        old_logprobs = self._old_logprobs(batch, [span for step in steps for span in step])

        sums = dict.fromkeys(_TOKEN_METRICS, 0.0)
        losses, grad_norms, num_tokens, num_skipped = [], [], 0.0, 0
        for step in steps:
            step_mask = batch.loss_mask[step[0][0] : step[-1][1]]  # [S, L]
            if step_mask.sum() == 0:
                continue
            denom = float(step[-1][1] - step[0][0]) if self.loss_agg == "seq_mean" else float(step_mask.sum())
            self.optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for span in step:
                loss, metrics = self._micro_batch_loss(batch.slice(*span), old_logprobs[span], denom)
                loss.backward()
                step_loss += float(loss.detach())
                num_tokens += metrics["num_tokens"]
                for key in _TOKEN_METRICS:
                    sums[key] += metrics.get(key, 0.0) * metrics["num_tokens"]
            max_norm = cfg.clip_grad if cfg.clip_grad > 0 else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
            if math.isfinite(grad_norm):
                self.optimizer.step()
            else:
                num_skipped += 1
                logger.warning("skipping optimizer step: grad_norm=%s at policy_version %d", grad_norm, self.policy_version)
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(step_loss)
            grad_norms.append(grad_norm)
        self.policy_version += 1

        out = {key: sums[key] / max(num_tokens, 1.0) for key in _TOKEN_METRICS}
        if not cfg.use_tis:
            del out["tis_mean"], out["tis_clipfrac"]
        out.update(self._batch_metrics(batch, old_logprobs))
        out.update(
            loss=sum(losses) / max(len(losses), 1),
            grad_norm=sum(grad_norms) / max(len(grad_norms), 1),
            num_optimizer_steps=float(len(losses)),
            num_skipped_steps=float(num_skipped),
            policy_version=float(self.policy_version),
            train_time_s=time.perf_counter() - t0,
        )
        return out

    def _plan(self, num_samples: int) -> list[list[Span]]:
        """Optimizer steps of ``global_batch_size`` samples, each a list of micro-batch spans."""
        gbs, mbs = self.config.global_batch_size, self.config.micro_batch_size
        steps = []
        for start in range(0, num_samples, gbs):
            end = min(start + gbs, num_samples)
            steps.append([(s, min(s + mbs, end)) for s in range(start, end, mbs)])
        return steps

    @torch.no_grad()
    def _old_logprobs(self, batch: TrainBatch, spans: list[Span]) -> dict[Span, Tensor]:
        """[b, l] logprobs of each micro-batch under the weights before this train step."""
        out = {}
        for span in spans:
            mb = batch.slice(*span)
            out[span] = compute_token_logprobs(
                self.model, mb.input_ids, mb.attention_mask, temperature=self.config.rollout_temperature
            )
        return out

    def _micro_batch_loss(self, mb: TrainBatch, old_logprobs: Tensor, denom: float) -> tuple[Tensor, dict[str, float]]:
        cfg = self.config
        logprobs, entropy = compute_token_logprobs_and_entropy(
            self.model, mb.input_ids, mb.attention_mask, temperature=cfg.rollout_temperature
        )  # [b, l], [b, l]
        return policy_loss(
            logprobs,
            old_logprobs,
            mb.advantages,
            mb.loss_mask,
            eps_clip=cfg.eps_clip,
            eps_clip_high=cfg.eps_clip_high,
            rollout_logprobs=mb.rollout_logprobs,
            use_tis=cfg.use_tis,
            tis_clip=cfg.tis_clip,
            tis_clip_low=cfg.tis_clip_low,
            loss_agg=self.loss_agg,
            loss_denominator=denom,
            entropy=entropy,
        )

    def _batch_metrics(self, batch: TrainBatch, old_logprobs: dict[Span, Tensor]) -> dict[str, float]:
        abs_diff = 0.0
        for (start, end), old in old_logprobs.items():
            mb = batch.slice(start, end)
            abs_diff += float(((old - mb.rollout_logprobs).abs() * mb.loss_mask).sum())
        num_train_tokens = batch.num_train_tokens
        trained_staleness = batch.staleness[batch.loss_mask > 0].float()  # [num_train_tokens]
        has_reward = ~batch.rewards.isnan()  # [B]
        return {
            "train_rollout_logprob_abs_diff": abs_diff / max(num_train_tokens, 1),
            "reward_mean": float(batch.rewards[has_reward].mean()) if bool(has_reward.any()) else 0.0,
            "advantage_abs_mean": float(batch.sample_advantages.abs().mean()),
            "staleness_mean": float(trained_staleness.mean()) if num_train_tokens else 0.0,
            "staleness_max": float(trained_staleness.max()) if num_train_tokens else 0.0,
            "num_samples": float(batch.num_samples),
            "num_train_tokens": float(num_train_tokens),
        }

    def save_hf(self, out_dir: str) -> str:
        """Write the current weights as an HF model directory, atomically; return its path.

        Writes config.json, generation_config.json and model.safetensors (transformers 5 always
        writes safetensors) into a temporary sibling directory, copies ``TOKENIZER_FILES`` from
        ``model_dir`` when present, then renames it to ``out_dir``. A reader never sees a
        half-written directory; when ``out_dir`` already exists it is moved aside first and
        deleted after, so for that moment ``out_dir`` is absent.
        """
        out = os.path.abspath(out_dir)
        parent, name = os.path.split(out)
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
        try:
            os.chmod(tmp, 0o755)
            with self._lock:
                self.model.save_pretrained(tmp)
            for fname in TOKENIZER_FILES:
                src = os.path.join(self.model_dir, fname)
                if os.path.isfile(src) and not os.path.exists(os.path.join(tmp, fname)):
                    shutil.copy2(src, os.path.join(tmp, fname))
            if os.path.exists(out):
                trash = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
                os.rename(out, os.path.join(trash, name))
                os.rename(tmp, out)
                shutil.rmtree(trash)
            else:
                os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out

    def state_dict_for_sync(self) -> dict[str, Tensor]:
        """A copy of the weights, keyed by HF parameter name (fp32, CPU), safe to read while training."""
        with self._lock:
            return {name: t.detach().clone() for name, t in self.model.state_dict().items()}
