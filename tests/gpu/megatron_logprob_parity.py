"""GPU check (a): megatron-core logprobs vs the torch backend's on the same weights and tokens (1 GPU).

    python tests/gpu/megatron_logprob_parity.py      # writes $OUT/megatron_parity.json, exits 1 on failure

Checks, on a random Qwen2-0.5B-wide model (4 layers) and ragged packed samples:
  1. bf16: |megatron old_logprobs - HF bf16 logprobs| over trained tokens, mean <= 1e-2;
  2. fp32: the same, mean <= 1e-3 (TF32 matmuls are off);
  3. varlen flash attention vs per-sequence SDPA: max |diff| of the logprobs (reported);
  4. one MegatronTrainer.train_step: finite loss and grad norm, first-step ratio_mean == 1 (+- 1e-3);
  5. save_hf after that step, reloaded with transformers: logprobs still match megatron's (mean <= 1e-2).
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_common import SMALL, make_groups, make_hf_dir, write_json  # noqa: E402

from slime.config import MegatronConfig, TrainConfig  # noqa: E402
from slime.train.batch import build_train_batch  # noqa: E402
from slime.train.logprobs import compute_token_logprobs  # noqa: E402


def _hf_logprobs(model_dir: str, batch, dtype: torch.dtype) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda().eval()
    out = []
    with torch.no_grad():
        for start in range(0, batch.num_samples, 4):
            mb = batch.slice(start, min(start + 4, batch.num_samples))
            lp = (
                compute_token_logprobs(hf, mb.input_ids.cuda(), mb.attention_mask.cuda(), temperature=1.0).float().cpu()
            )
            full = torch.zeros(lp.shape[0], batch.loss_mask.shape[1])
            full[:, : lp.shape[1]] = lp
            out.append(full)
    del hf
    torch.cuda.empty_cache()
    return torch.cat(out)


def _diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    d = (a - b).abs()[mask > 0]
    return {"mean_abs_diff": float(d.mean()), "max_abs_diff": float(d.max())}


def _trainer(model_dir: str, *, bf16: bool):
    from slime.train.megatron.trainer import MegatronTrainer

    cfg = TrainConfig(
        train_backend="megatron",
        global_batch_size=16,
        micro_batch_size=4,
        lr=1e-6,
        megatron=MegatronConfig(bf16=bf16, use_dynamic_batch_size=True, max_tokens_per_gpu=4096),
    )
    return MegatronTrainer(cfg, model_dir=model_dir)


def main() -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    from slime.train.megatron.layers import SDPACoreAttention

    root = "/tmp/slime_gpu"
    bf16_dir = make_hf_dir(f"{root}/small_bf16", SMALL, dtype=torch.bfloat16)
    fp32_dir = make_hf_dir(f"{root}/small_fp32", SMALL, dtype=torch.float32)
    groups = make_groups(vocab_size=SMALL["vocab_size"], num_groups=2, group_size=8, prompt_len=64, response_len=448)
    batch = build_train_batch(groups, pad_token_id=0, current_version=0)
    mask = batch.loss_mask
    result: dict[str, object] = {"num_samples": batch.num_samples, "num_train_tokens": batch.num_train_tokens}

    t0 = time.perf_counter()
    trainer = _trainer(bf16_dir, bf16=True)
    mg_bf16 = trainer._before_update(batch, trainer._plan(batch)).old_logprobs  # dense padded batches where chosen
    ratio = SDPACoreAttention.dense_padding_ratio
    SDPACoreAttention.dense_padding_ratio = 0.0
    mg_varlen = trainer._before_update(batch, trainer._plan(batch)).old_logprobs
    SDPACoreAttention.use_varlen = False
    mg_loop = trainer._before_update(batch, trainer._plan(batch)).old_logprobs
    SDPACoreAttention.use_varlen, SDPACoreAttention.dense_padding_ratio = True, ratio
    result["bf16"] = _diff(mg_bf16, _hf_logprobs(bf16_dir, batch, torch.bfloat16), mask)
    result["default_vs_varlen"] = _diff(mg_bf16, mg_varlen, mask)
    result["varlen_vs_sdpa_loop"] = _diff(mg_varlen, mg_loop, mask)

    metrics = trainer.train_step(groups).to_dict()
    result["train_step"] = {
        k: metrics[k] for k in ("loss", "grad_norm", "ratio_mean", "entropy", "num_optimizer_steps", "train_time_s")
    }
    result["train_step"]["attention_dense_fraction"] = metrics.get(
        "attention_dense_fraction"
    )  # None: no half-precision CUDA pass
    saved = trainer.save_hf(f"{root}/after_step")
    mg_after = trainer._before_update(batch, trainer._plan(batch)).old_logprobs
    result["saved_after_step"] = _diff(mg_after, _hf_logprobs(saved, batch, torch.bfloat16), mask)
    synced = trainer.state_dict_for_sync()
    result["state_dict_for_sync"] = {
        "num_tensors": len(synced),
        "all_finite": all(bool(t.isfinite().all()) for t in synced.values()),
    }
    del trainer, synced

    fp32 = _trainer(fp32_dir, bf16=False)
    mg_fp32 = fp32._before_update(batch, fp32._plan(batch)).old_logprobs
    result["fp32"] = _diff(mg_fp32, _hf_logprobs(fp32_dir, batch, torch.float32), mask)
    result["wall_s"] = time.perf_counter() - t0
    from slime.train.megatron import fusion

    result["fused"] = fusion.status()  # which elementwise chains ran through torch.compile

    step = result["train_step"]
    checks = {
        "bf16_mean_abs_diff<=1e-2": result["bf16"]["mean_abs_diff"] <= 1e-2,
        "dense_path_vs_varlen_mean_abs_diff<=1e-2": result["default_vs_varlen"]["mean_abs_diff"] <= 1e-2,
        "fp32_mean_abs_diff<=1e-3": result["fp32"]["mean_abs_diff"] <= 1e-3,
        "train_step_finite": math.isfinite(step["loss"]) and math.isfinite(step["grad_norm"]),
        "first_step_ratio_is_1": abs(step["ratio_mean"] - 1.0) <= 1e-3,
        "saved_hf_matches<=1e-2": result["saved_after_step"]["mean_abs_diff"] <= 1e-2,
        "sync_tensors_finite": result["state_dict_for_sync"]["all_finite"],
    }
    result["checks"] = checks
    result["passed"] = all(checks.values())
    write_json("megatron_parity.json", result)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
