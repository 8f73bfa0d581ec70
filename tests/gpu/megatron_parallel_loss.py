"""GPU check (c), one configuration: two RL train steps on a fixed batch; rank 0 writes the metrics.

    torchrun --standalone --nproc-per-node N tests/gpu/megatron_parallel_loss.py --tp T --name NAME [--sequence-parallel]
    torchrun ... --model-dir MOE_DIR --ep E [--etp T] --micro-batch-size 1 --moe-aux-loss-coeff C --name NAME

DP = N / T. The model (random Qwen2-0.5B width, 4 layers, bf16) must exist at --model-dir first
(``megatron_checks.sh`` makes it). 16 ragged samples, global batch 8 -> two optimizer steps per
train step; the second step's loss, the grad norms and the entropies depend on the weights, so
they expose any TP/DP/EP difference. ``megatron_compare_parallel.py`` compares the NAME files.

MoE models (``--ep``, ``--etp``): the router metrics (``moe_*``: load per expert, load-balancing
loss, dropped tokens) are recorded and compared too. One sample per micro-batch
(``--micro-batch-size 1`` without ``--dynamic``) makes the micro-batches the same whatever the
DP split, so the per-micro-batch load-balancing loss (and its gradient, with
``--moe-aux-loss-coeff``) must match as well. ``--check-gather`` first gathers the weights onto
rank 0 as HF tensors (``state_dict_for_sync``) and records whether they equal the checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_common import make_groups, write_json  # noqa: E402

KEYS = ("loss", "grad_norm", "entropy", "ratio_mean", "approx_kl", "train_rollout_logprob_abs_diff")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--name", required=True)
    p.add_argument("--model-dir", default="/tmp/slime_gpu/small_bf16")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--ep", type=int, default=1, help="--expert-model-parallel-size")
    p.add_argument("--etp", type=int, default=None, help="--expert-tensor-parallel-size (default: TP)")
    p.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument(
        "--static", action="store_true", help="micro-batches of --micro-batch-size samples instead of a token budget"
    )
    p.add_argument(
        "--check-gather",
        action="store_true",
        help="before training, gather the weights (state_dict_for_sync) and compare with the checkpoint",
    )
    p.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    args = p.parse_args()

    from slime.config import MegatronConfig, TrainConfig
    from slime.train.megatron.arch import load_hf_config
    from slime.train.megatron.trainer import MegatronTrainer

    cfg = TrainConfig(
        train_backend="megatron",
        global_batch_size=8,
        micro_batch_size=args.micro_batch_size,
        lr=1e-5,
        megatron=MegatronConfig(
            tensor_model_parallel_size=args.tp,
            bf16=True,
            use_dynamic_batch_size=not args.static,
            max_tokens_per_gpu=1024,
            sequence_parallel=args.sequence_parallel,
            use_distributed_optimizer=args.distributed_optimizer,
            expert_model_parallel_size=args.ep,
            expert_tensor_parallel_size=args.etp,
            moe_aux_loss_coeff=args.moe_aux_loss_coeff,
        ),
    )
    trainer = MegatronTrainer(cfg, model_dir=args.model_dir)
    vocab = int(load_hf_config(args.model_dir)["vocab_size"])
    groups = make_groups(vocab_size=vocab, num_groups=2, group_size=8, prompt_len=32, response_len=256, seed=7)
    if not trainer.is_driver:
        trainer.serve()
        return 0
    extra = {}
    if args.check_gather:  # every rank joins through serve(): dense over TP, experts over the ETP x EP group
        from slime.train.megatron.model import HFCheckpointReader

        synced, reader = trainer.state_dict_for_sync(), HFCheckpointReader(args.model_dir)
        same = sorted(synced) == sorted(reader.keys()) and all(
            torch.equal(synced[k], reader[k].float()) for k in reader.keys()
        )
        extra = {"num_gathered_tensors": len(synced), "weights_gathered_bit_exact": same}
    steps = []
    for _ in range(2):
        m = trainer.train_step(groups).to_dict()
        steps.append({k: m[k] for k in (*KEYS, *sorted(k for k in m if k.startswith("moe_")))})
    ctx = trainer.ctx
    trainer.close()
    os.makedirs(args.out_dir, exist_ok=True)
    layout = {
        "tp": ctx.tp_size,
        "dp": ctx.dp_size,
        "ep": ctx.ep_size,
        "etp": ctx.etp_size,
        "world_size": ctx.world_size,
    }
    write_json(f"parallel_{args.name}.json", {**layout, **extra, "steps": steps}, out_dir=args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
