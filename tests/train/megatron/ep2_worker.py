"""Run by test_megatron_ep2.py under ``torchrun --nproc-per-node 2`` on the CPU (gloo): expert parallel megatron vs HF (sequence parallel when TP > 1, as MoE under TP requires).

Each rank loads its share of a Qwen3-MoE / Qwen2-MoE HF directory (its TP shard of the dense
weights, its EP rank's experts, its ETP shard of each), runs the same packed micro-batch through
the "allgather" token dispatcher, and checks: logits (gathered over TP) match HF's; the weights
gathered back onto rank 0 (``iter_hf_weights``, experts over the ETP x EP group) equal the HF
checkpoint bit for bit. The CUDA redirection is the one ``conftest.megatron_cpu`` explains; the CUDA RNG fork that
megatron's sequence-parallel embedding enters is made a no-op (no dropout runs).

    torchrun --nproc-per-node 2 ep2_worker.py HF_DIR OUT_JSON TP EP ETP
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch
import torch.distributed as dist

torch.cuda.current_device = lambda: "cpu"  # see conftest.megatron_cpu
torch.set_num_threads(1)


def main(hf_dir: str, out_path: str, tp: str, ep: str, etp: str) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from slime.config import MegatronConfig
    from slime.train.batch import TrainBatch
    from slime.train.megatron.arch import ModelArch, load_hf_config
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config
    from slime.train.megatron.packing import pack_samples
    from slime.train.megatron.parallel import init_parallel
    from slime.train.megatron.weights import iter_hf_weights

    mcfg = MegatronConfig(
        tensor_model_parallel_size=int(tp),
        expert_model_parallel_size=int(ep),
        expert_tensor_parallel_size=int(etp),
        moe_token_dispatcher_type="allgather",
        sequence_parallel=int(tp) > 1,
    )
    ctx = init_parallel(mcfg, seed=0)
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    get_cuda_rng_tracker().fork = lambda *a, **k: (
        contextlib.nullcontext()
    )  # test-only: sequence parallel's embedding forks the CUDA RNG (dropout 0 here)
    arch = ModelArch.from_hf_config(load_hf_config(hf_dir))
    model = build_gpt_model(arch, transformer_config(arch, mcfg, use_cpu_initialization=True), tp_size=ctx.tp_size)
    load_hf_weights(
        model,
        HFCheckpointReader(hf_dir),
        arch,
        tp_size=ctx.tp_size,
        tp_rank=ctx.tp_rank,
        ep_size=ctx.ep_size,
        ep_rank=ctx.ep_rank,
        etp_size=ctx.etp_size,
        etp_rank=ctx.etp_rank,
    )
    lens = [7, 5]
    ids = torch.zeros(2, 7, dtype=torch.long)
    torch.manual_seed(5)
    for i, n in enumerate(lens):
        ids[i, :n] = torch.randint(0, arch.vocab_size, (n,))
    z = torch.zeros(2, 6)
    batch = TrainBatch(
        ids,
        (torch.arange(7) < torch.tensor(lens)[:, None]).long(),
        z,
        z,
        z,
        z.long(),
        torch.zeros(2),
        torch.zeros(2),
        torch.tensor(lens),
        z,
    )
    mb = pack_samples(
        batch, [0, 1], pad_token_id=0, pad_to=ctx.tp_size, head_dim=arch.head_dim, rope_theta=arch.rope_theta
    )
    with torch.no_grad():
        local = model.eval()(
            input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
        )[0]
        parts = [torch.empty_like(local) for _ in range(ctx.tp_size)]
        dist.all_gather(parts, local.contiguous(), group=ctx.tp_group)
    gathered = dict(iter_hf_weights(model, arch, ctx))
    if ctx.is_driver:
        logits = torch.cat(parts, dim=-1)[:, : arch.vocab_size]
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = torch.cat([hf(input_ids=ids[i : i + 1, :n]).logits[0] for i, n in enumerate(lens)])
        state = load_file(f"{hf_dir}/model.safetensors")
        state = {k: v for k, v in state.items() if k in gathered or k != "lm_head.weight"}
        result = {
            "ranks": {"ep_size": ctx.ep_size, "etp_size": ctx.etp_size, "tp_size": ctx.tp_size, "dp_size": ctx.dp_size},
            "logits_max_abs_diff": float((logits - ref).abs().max()),
            "weights_bit_exact": sorted(gathered) == sorted(state)
            and all(torch.equal(gathered[k], v) for k, v in state.items()),
        }
        with open(out_path, "w") as f:
            json.dump(result, f)
    ctx.close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
