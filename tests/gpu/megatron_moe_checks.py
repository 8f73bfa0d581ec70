"""GPU check (m), MoE under expert parallelism: weight gather and logprobs against HF (any number of GPUs).

    torchrun --standalone --nproc-per-node N tests/gpu/megatron_moe_checks.py --model-dir MOE_DIR --ep E [--tp T]

Every rank builds the ``MegatronTrainer`` (each loads only its experts) and, in lockstep:
  1. gathers the weights back as HF tensors (``iter_hf_weights``: dense over TP, experts over the
     ETP x EP group); rank 0 compares them with the checkpoint's safetensors: same names, bit-exact;
  2. computes ``old_logprobs`` of 16 ragged samples (the trainer's packed micro-batches, tokens
     dispatched all-to-all between EP ranks); rank 0 compares them with transformers' bf16
     forward of the same checkpoint (reported; mean |diff| <= 2e-2 checked: bf16 routing can flip
     a token's expert choice where two router scores tie to within rounding).
Writes $OUT/megatron_moe_checks_NAME.json on rank 0; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_common import make_groups, write_json  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--name", default="ep")
    args = p.parse_args()

    from slime.config import MegatronConfig, TrainConfig
    from slime.train.batch import build_train_batch
    from slime.train.megatron.arch import load_hf_config
    from slime.train.megatron.model import HFCheckpointReader
    from slime.train.megatron.trainer import MegatronTrainer
    from slime.train.megatron.weights import iter_hf_weights

    cfg = TrainConfig(
        train_backend="megatron", global_batch_size=16, micro_batch_size=4, lr=1e-6,
        megatron=MegatronConfig(tensor_model_parallel_size=args.tp, expert_model_parallel_size=args.ep, bf16=True, use_dynamic_batch_size=True, max_tokens_per_gpu=2048),
    )
    trainer = MegatronTrainer(cfg, model_dir=args.model_dir)
    ctx = trainer.ctx
    gathered = dict(iter_hf_weights(trainer.ddp, trainer.arch, ctx))
    vocab = int(load_hf_config(args.model_dir)["vocab_size"])
    groups = make_groups(vocab_size=vocab, num_groups=2, group_size=8, prompt_len=48, response_len=320, seed=3)
    batch = build_train_batch(groups, pad_token_id=0, current_version=0)
    old = trainer._before_update(batch, trainer._plan(batch)).old_logprobs
    result: dict[str, object] = {"layout": {"tp": ctx.tp_size, "dp": ctx.dp_size, "ep": ctx.ep_size, "etp": ctx.etp_size, "world_size": ctx.world_size}}
    if ctx.is_driver:
        reader = HFCheckpointReader(args.model_dir)
        names_match = sorted(gathered) == sorted(reader.keys())
        exact = names_match and all(torch.equal(gathered[k], reader[k]) for k in reader.keys())
        from transformers import AutoModelForCausalLM

        from slime.train.logprobs import compute_token_logprobs

        hf = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16).cuda().eval()
        ref = torch.zeros_like(old)
        with torch.no_grad():
            for s in range(0, batch.num_samples, 4):
                mb = batch.slice(s, min(s + 4, batch.num_samples))
                lp = compute_token_logprobs(hf, mb.input_ids.cuda(), mb.attention_mask.cuda(), temperature=1.0).float().cpu()
                ref[s : s + lp.shape[0], : lp.shape[1]] = lp
        d = (old - ref).abs()[batch.loss_mask > 0]
        result.update(
            num_hf_tensors=len(reader.keys()),
            weights_gathered_bit_exact=bool(exact),
            logprobs_vs_hf_bf16={"mean_abs_diff": float(d.mean()), "max_abs_diff": float(d.max()), "num_tokens": int(d.numel())},
        )
        result["checks"] = {"weights_gathered_bit_exact": bool(exact), "logprob_mean_abs_diff<=2e-2": float(d.mean()) <= 2e-2}
        result["passed"] = all(result["checks"].values())
        write_json(f"megatron_moe_checks_{args.name}.json", result)
    ctx.close()  # every rank: no "stop" command, the ranks ran in lockstep rather than through serve()
    return 0 if (not ctx.is_driver or result["passed"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
