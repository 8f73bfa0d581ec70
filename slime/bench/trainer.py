"""Trainer benchmark: RL train steps of one backend against another, on the same groups, in one process.

Used by ``scripts/gpu/bench_trainer.py`` (megatron backend vs a plain-transformers reference, issue 18)
and ``scripts/bench_megatron_mfu.py`` (the megatron backend alone). Parts:

- ``SHAPES``: Qwen2 model shapes (HF config keys) for random-weight models.
- ``flops_per_token``: the FLOPs formula every MFU number of the project uses.
- ``matmul_ceiling_tflops``: the dense-matmul throughput measured in this process (the MFU denominator).
- ``TransformersReference``: a plain-transformers RL step (``AutoModelForCausalLM``, SDPA, eager,
  fused AdamW), the baseline a user would write without megatron.
- ``BackendUnderTest`` adapters (``megatron_backend``, ``torch_backend``, the reference) and ``measure``:
  each backend's whole RL step (old-logprob pass + train step) and its old-logprob pass alone,
  warm-up steps excluded, median of N.
- ``slime.bench.step_profile``: what a step's time hides (``profile_summary``, ``GCPauses``, ``host_events``).

FLOPs per token (N = matmul parameters incl. the output layer, s = sequence length, causal attention
counted in full as the usual convention): forward ``2 N + 2 s * heads * head_dim * layers``; training
(forward + backward) 3x that. MFU = FLOPs / seconds / ceiling.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from slime.bench.step_profile import GCPauses, host_events, sync
from slime.config import TrainConfig
from slime.train import objective
from slime.train.batch import TrainBatch, build_train_batch, pack_by_token_budget
from slime.train_metrics import TrainMetrics
from slime.types import Group, JsonObject

__all__ = [
    "SHAPES", "flops_per_token", "matmul_ceiling_tflops", "TransformersReference", "BackendUnderTest", "megatron_backend",
    "torch_backend", "measure", "markdown_table",
]  # fmt: skip

_QWEN2 = dict(
    vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True
)
SHAPES: dict[str, dict] = {
    "qwen2-0.5b": dict(_QWEN2, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
    "qwen2-1.5b": dict(_QWEN2, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2),
    "qwen2.5-3b": dict(_QWEN2, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2),
    "qwen2-7b": dict(_QWEN2, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, tie_word_embeddings=False),
    "tiny": dict(_QWEN2, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
}  # fmt: skip
"""Qwen2 shapes (494M, 1.54B, 3.09B and 7.6B parameters; ``tiny`` for CPU smoke tests), HF ``Qwen2Config`` keys."""


def flops_per_token(shape: dict, seq_len: int) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs per token of a dense decoder of ``shape`` at ``seq_len`` (module docstring)."""
    h, ffn, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    d = shape.get("head_dim") or h // heads
    per_layer = h * (heads + 2 * kv) * d + heads * d * h + 3 * h * ffn
    n_matmul = layers * per_layer + shape["vocab_size"] * h
    fwd = 2 * n_matmul + 2 * seq_len * heads * d * layers
    return fwd, 3 * fwd


def matmul_ceiling_tflops(device: torch.device | str = "cuda", n: int | None = None) -> float:
    """TFLOP/s of an n x n x n matmul (bf16 8192^3 on CUDA, fp32 256^3 on the CPU), mean of 10 after 3 warm-ups."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    n = n or (8192 if cuda else 256)
    dtype = torch.bfloat16 if cuda else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 2 * n**3 * 10 / (time.perf_counter() - t0) / 1e12


class BackendUnderTest(Protocol):
    """What ``measure`` times: a whole RL step, and the old-logprob pass of one alone."""

    name: str
    device: torch.device

    def rl_step(self, groups: Sequence[Group]) -> TrainMetrics: ...

    def old_logprob_pass(self, groups: Sequence[Group]) -> None: ...

    def close(self) -> None: ...


class TransformersReference:
    """A plain-transformers RL step: what one writes with ``AutoModelForCausalLM`` and no megatron.

    Per step: the batch on the device; micro-batches padded to at most ``max_tokens_per_gpu`` tokens
    (``pack_by_token_budget``, as the torch backend packs); an old-logprob pass without grad; per
    optimizer step of ``global_batch_size`` samples, per micro-batch: forward (SDPA attention, eager),
    token logprobs by ``cross_entropy`` on fp32 logits, ``objective.micro_batch_loss`` (the loss both
    backends use), backward; ``clip_grad_norm_``; fused AdamW. No entropy is computed (the backends
    compute it for their metrics), so the reference does a little less work than they do.

    Args:
        config: ``TrainConfig`` (batch sizes, lr, Adam, clip, algorithm, ``megatron.max_tokens_per_gpu``).
        model_dir: HF directory.
        device: where it trains.
        precision: ``autocast`` = fp32 weights, grads and AdamW state (master weights) and bf16 autocast,
            like megatron's ``--bf16``; ``bf16`` = bf16 weights, grads and AdamW state (no master copy);
            ``fp32`` = no autocast (exact comparisons on the CPU).
        rollout_temperature: logits are divided by it before log_softmax, as the backends do.
    """

    name = "transformers"

    def __init__(
        self,
        config: TrainConfig,
        *,
        model_dir: str,
        device: torch.device,
        precision: str = "autocast",
        rollout_temperature: float = 1.0,
    ):
        from transformers import AutoModelForCausalLM

        if precision not in ("autocast", "bf16", "fp32"):
            raise ValueError(f"precision={precision!r}: expected 'autocast', 'bf16' or 'fp32'")
        self.config, self.device, self.precision = config, torch.device(device), precision
        self.rollout_temperature = rollout_temperature
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
        # transformers types .to() through a decorator that takes the model itself
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]
        self.pad_token_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.weight_decay,
            fused=self.device.type == "cuda" or None,
        )
        self.policy_version = 0

    def _batch(self, groups: Sequence[Group]) -> tuple[TrainBatch, list[list[list[int]]]]:
        cfg = self.config
        batch = build_train_batch(
            groups, pad_token_id=self.pad_token_id, current_version=self.policy_version, max_staleness=None
        )
        lens = batch.seq_lens.tolist()
        steps = []
        for start in range(0, len(lens), cfg.global_batch_size):
            end = min(start + cfg.global_batch_size, len(lens))
            steps.append(
                [
                    [start + i for i in mb]
                    for mb in pack_by_token_budget(lens[start:end], cfg.megatron.max_tokens_per_gpu)
                ]
            )
        return batch.to(self.device), steps

    def _logprobs(self, mb: TrainBatch) -> torch.Tensor:
        """[b, L] float32 logprob of each next token under ``log_softmax(logits / T)``; 0 at padding."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "autocast"):
            position_ids = (mb.attention_mask.cumsum(-1) - 1).clamp_min(0)  # [b, T]
            logits = self.model(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=position_ids, use_cache=False
            ).logits
        logits = logits[:, :-1].float()  # [b, L, V]
        if self.rollout_temperature != 1.0:
            logits = logits / self.rollout_temperature
        targets = mb.input_ids[:, 1:]  # [b, L]
        nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
        return -nll * mb.attention_mask[:, 1:]

    @torch.no_grad()
    def _old_logprobs(self, batch: TrainBatch, steps: list[list[list[int]]]) -> torch.Tensor:
        old = torch.zeros_like(batch.loss_mask)  # [B, L]
        for indices in (mb for step in steps for mb in step):
            mb = batch.select(indices)
            rows = torch.as_tensor(indices, device=self.device)[:, None]
            old[rows, torch.arange(mb.loss_mask.shape[1], device=self.device)[None, :]] = self._logprobs(mb)
        return old

    def old_logprob_pass(self, groups: Sequence[Group]) -> None:
        batch, steps = self._batch(groups)
        self._old_logprobs(batch, steps)

    def rl_step(self, groups: Sequence[Group]) -> TrainMetrics:
        cfg = self.config
        batch, steps = self._batch(groups)
        batch = objective.with_advantages(
            cfg, dataclasses.replace(batch, old_logprobs=self._old_logprobs(batch, steps))
        )
        losses, norms = [], []
        for step in steps:
            rows = [i for mb in step for i in mb]
            denom = float(len(rows)) if cfg.loss_agg == "seq_mean" else float(batch.loss_mask[rows].sum())
            total = torch.zeros((), device=self.device)
            for indices in step:
                mb = batch.select(indices)
                loss, _ = objective.micro_batch_loss(cfg, mb, self._logprobs(mb), None, denom)
                loss.backward()
                total += loss.detach()
            norms.append(
                torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(), cfg.clip_grad if cfg.clip_grad > 0 else float("inf")
                )
            )
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(total)
        self.policy_version += 1
        return TrainMetrics(loss=float(torch.stack(losses).mean()), grad_norm=float(torch.stack(norms).mean()))

    def close(self) -> None:
        del self.model, self.optimizer  # their GPU memory; the backend is not used again


class _TrainerAdapter:
    """A slime trainer (``train_step``, ``_plan``, ``_before_update``) as a ``BackendUnderTest``."""

    def __init__(self, name: str, trainer: Any, device: torch.device, batch_to: Callable[[TrainBatch], Any]):
        self.name, self.trainer, self.device, self._prepare = name, trainer, device, batch_to

    def rl_step(self, groups: Sequence[Group]) -> TrainMetrics:
        return self.trainer.train_step(groups)

    def old_logprob_pass(self, groups: Sequence[Group]) -> None:
        t = self.trainer
        batch = build_train_batch(groups, pad_token_id=t.pad_token_id, current_version=t.policy_version)
        batch, plan = self._prepare(batch)
        t._before_update(batch, plan)

    def close(self) -> None:
        close = getattr(self.trainer, "close", None)
        if close is not None:
            close()
        self.trainer = None


def megatron_backend(trainer: Any) -> _TrainerAdapter:
    """A ``MegatronTrainer`` (or a test's CPU stand-in) as a ``BackendUnderTest``."""
    device = trainer.ctx.device if hasattr(trainer, "ctx") else torch.device("cpu")
    return _TrainerAdapter("megatron", trainer, device, lambda batch: (batch, trainer._plan(batch)))


def torch_backend(trainer: Any) -> _TrainerAdapter:
    """A ``TorchTrainer`` (slime's torch backend) as a ``BackendUnderTest``."""

    def prepare(batch: TrainBatch):
        return batch.to(trainer.device), [mb for step in trainer._plan(batch.seq_lens.tolist()) for mb in step]

    return _TrainerAdapter("torch", trainer, trainer.device, prepare)


def measure(
    backend: BackendUnderTest,
    groups: Sequence[Group] | Callable[[int], Sequence[Group]],
    *,
    warmup: int,
    steps: int,
    fwd_flops: float,
    train_flops: float,
    ceiling_tflops: float,
) -> JsonObject:
    """Time ``warmup`` + ``steps`` RL steps, each followed by one old-logprob pass alone; medians of the last ``steps``.
    ``groups`` is the step's data, or ``groups(i)`` step i's (new data every step: new micro-batch shapes).

    Returns (seconds, fractions): ``rl_step_s`` (old-logprob pass + train step), ``old_logprob_pass_s``,
    ``train_opt_s`` (= their difference: forward + backward + optimizer), ``mfu_train_opt``
    (``train_flops`` / ``train_opt_s`` / ceiling), ``mfu_rl_step`` ((train + fwd) FLOPs / ``rl_step_s`` /
    ceiling), ``warmup_s`` (first step, compilation included), every sample, the last metrics,
    ``peak_memory_gib`` on CUDA, and ``per_step`` (warm-up included): each step's times with the garbage
    collector's pauses and the compiles, new allocator segments and allocator retries it saw.
    """
    dev = backend.device
    per_step: list[dict[str, float]] = []  # every step, warm-up included: what a slow step coincided with
    metrics = TrainMetrics()
    for i in range(warmup + steps):
        before = host_events(dev)
        with GCPauses() as pauses:
            sync(dev)
            t0 = time.perf_counter()
            step_groups = groups(i) if callable(groups) else groups
            metrics = backend.rl_step(step_groups)
            sync(dev)
            t1 = time.perf_counter()
            backend.old_logprob_pass(step_groups)
            sync(dev)
            t2 = time.perf_counter()
        after = host_events(dev)
        per_step.append(
            {"rl_step_s": t1 - t0, "old_logprob_pass_s": t2 - t1, "gc_ms": pauses.ms, "gc_full": pauses.full}
            | {k: after[k] - before[k] for k in after}
        )
    timed = per_step[warmup:]
    rl, old = [s["rl_step_s"] for s in timed], [s["old_logprob_pass_s"] for s in timed]
    rl_s, old_s = statistics.median(rl), statistics.median(old)
    train_s = max(rl_s - old_s, 1e-9)
    out = {
        "rl_step_s": rl_s, "old_logprob_pass_s": old_s, "train_opt_s": train_s,
        "mfu_train_opt": train_flops / train_s / 1e12 / ceiling_tflops,
        "mfu_rl_step": (train_flops + fwd_flops) / rl_s / 1e12 / ceiling_tflops,
        "tflops_train_opt": train_flops / train_s / 1e12,
        "warmup_s": per_step[0]["rl_step_s"], "rl_step_times_s": rl, "old_logprob_pass_times_s": old,
        "loss": metrics.loss, "grad_norm": metrics.grad_norm,
        "attention_dense_fraction": metrics.attention_dense_fraction,  # megatron on a GPU: which attention ran
        "gc_pause_ms_per_step": [s["gc_ms"] for s in timed], "gc_full_collections": sum(s["gc_full"] for s in timed),
        "per_step": per_step,
    }  # fmt: skip
    if dev.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return out


def markdown_table(results: dict[str, JsonObject], *, reference: str = "transformers", other: str = "megatron") -> str:
    """One row per shape: each backend's train+opt MFU and RL step, and ``reference`` / ``other`` speed-up."""
    head = (
        "| shape | backend | train+opt s | train+opt MFU | old-logprob pass s | RL step s | RL step MFU | peak GiB |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    rows, ratios = [head], []
    for shape, res in results.items():
        for name, r in res.get("backends", {}).items():
            if "skipped" in r:
                rows.append(f"| {shape} | {name} | skipped: {r['skipped'][:60]} | | | | | |")
                continue
            peak = f"{r['peak_memory_gib']:.1f}" if "peak_memory_gib" in r else "-"
            rows.append(
                f"| {shape} | {name} | {r['train_opt_s']:.3f} | {100 * r['mfu_train_opt']:.1f} % | {r['old_logprob_pass_s']:.3f} | "
                f"{r['rl_step_s']:.3f} | {100 * r['mfu_rl_step']:.1f} % | {peak} |"
            )
        if res.get("speedup_rl_step") is not None:
            line = f"{shape}: {other} RL step {res['speedup_rl_step']:.2f}x the {reference} one (train+opt {res['speedup_train_opt']:.2f}x)"
            ref, oth = res["backends"][reference], res["backends"][other]
            if ref.get("rl_step_times_s") and oth.get("rl_step_times_s"):  # the median hides a noisy shape's spread
                lo, hi = ref["rl_step_s"] / max(oth["rl_step_times_s"]), ref["rl_step_s"] / min(oth["rl_step_times_s"])
                line += f"; {other}'s steps give {lo:.2f}x to {hi:.2f}x"
            ratios.append(line)
    return "\n".join(rows + ([""] + ratios if ratios else []))
