"""GPU check (c), one configuration: two RL train steps on a fixed batch; rank 0 writes the metrics.

    torchrun --standalone --nproc-per-node N tests/gpu/megatron_parallel_loss.py --tp T --name NAME [--sequence-parallel]

DP = N / T. The model (random Qwen2-0.5B width, 4 layers, bf16) must exist at --model-dir first
(``megatron_checks.sh`` makes it). 16 ragged samples, global batch 8 -> two optimizer steps per
train step; the second step's loss, the grad norms and the entropies depend on the weights, so
they expose any TP/DP difference. ``megatron_compare_parallel.py`` compares the NAME files.
"""

from __future__ import annotations

import argparse
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_common import SMALL, make_groups, write_json  # noqa: E402

KEYS = ("loss", "grad_norm", "entropy", "ratio_mean", "approx_kl", "train_rollout_logprob_abs_diff")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--name", required=True)
    p.add_argument("--model-dir", default="/tmp/slime_gpu/small_bf16")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    args = p.parse_args()

    from slime.config import MegatronConfig, TrainConfig
    from slime.train.megatron.trainer import MegatronTrainer

    cfg = TrainConfig(
        train_backend="megatron", global_batch_size=8, micro_batch_size=2, lr=1e-5, max_staleness=8,
        megatron=MegatronConfig(
            tensor_model_parallel_size=args.tp, bf16=True, use_dynamic_batch_size=True, max_tokens_per_gpu=1024,
            sequence_parallel=args.sequence_parallel, use_distributed_optimizer=args.distributed_optimizer,
        ),
    )
    trainer = MegatronTrainer(cfg, model_dir=args.model_dir)
    groups = make_groups(vocab_size=SMALL["vocab_size"], num_groups=2, group_size=8, prompt_len=32, response_len=256, seed=7)
    if not trainer.is_driver:
        trainer.serve()
        return 0
    steps = []
    for _ in range(2):
        m = trainer.train_step(groups)
        steps.append({k: m[k] for k in KEYS})
    trainer.close()
    os.makedirs(args.out_dir, exist_ok=True)
    write_json(f"parallel_{args.name}.json", {"tp": args.tp, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "steps": steps}, out_dir=args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
