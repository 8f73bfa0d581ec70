"""Run by test_megatron_tp2.py under ``torchrun --nproc-per-node 2`` on the CPU (gloo): TP=2 megatron vs HF.

Each rank loads its TP shard straight from the HF directory, runs a packed forward, and checks:
logits (gathered over TP) match HF's; vocab-parallel logprobs match a full log_softmax; the
weights gathered back onto rank 0 (``iter_hf_weights``) equal the HF checkpoint bit for bit.
The CUDA redirection is the one ``conftest.megatron_cpu`` explains (test code only).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

torch.cuda.current_device = lambda: "cpu"  # see conftest.megatron_cpu
torch.set_num_threads(1)


def main(hf_dir: str, family: str, out_path: str) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from slime.config import MegatronConfig
    from slime.train.batch import TrainBatch
    from slime.train.megatron.arch import ModelArch, load_hf_config
    from slime.train.megatron.logprobs import vocab_parallel_logprobs
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config
    from slime.train.megatron.packing import pack_samples
    from slime.train.megatron.parallel import init_parallel
    from slime.train.megatron.weights import iter_hf_weights

    mcfg = MegatronConfig(tensor_model_parallel_size=2)
    ctx = init_parallel(mcfg, seed=0)
    arch = ModelArch.from_hf_config(load_hf_config(hf_dir))
    model = build_gpt_model(arch, transformer_config(arch, mcfg, use_cpu_initialization=True), tp_size=2)
    load_hf_weights(model, HFCheckpointReader(hf_dir), arch, tp_size=2, tp_rank=ctx.tp_rank)
    lens = [6, 4]
    ids = torch.zeros(2, 6, dtype=torch.long)
    torch.manual_seed(5)
    for i, n in enumerate(lens):
        ids[i, :n] = torch.randint(0, arch.vocab_size, (n,))
    z = torch.zeros(2, 5)
    batch = TrainBatch(
        ids,
        (torch.arange(6) < torch.tensor(lens)[:, None]).long(),
        z,
        z,
        z,
        z.long(),
        torch.zeros(2),
        torch.zeros(2),
        torch.tensor(lens),
        z,
    )
    mb = pack_samples(batch, [0, 1], pad_token_id=0, pad_to=2, head_dim=arch.head_dim, rope_theta=arch.rope_theta)
    with torch.no_grad():
        local = model(
            input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
        )[0]
        lp, _ = vocab_parallel_logprobs(
            local, mb.labels[0], temperature=0.9, vocab_size=arch.vocab_size, tp_rank=ctx.tp_rank, group=ctx.tp_group
        )
        parts = [torch.empty_like(local) for _ in range(2)]
        dist.all_gather(parts, local.contiguous(), group=ctx.tp_group)
    result = {}
    gathered = dict(iter_hf_weights(model, arch, ctx))
    if ctx.is_driver:
        logits = torch.cat(parts, dim=-1)[:, : arch.vocab_size]
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = torch.cat([hf(input_ids=ids[i : i + 1, :n]).logits[0] for i, n in enumerate(lens)])
        full_lp = torch.log_softmax(logits / 0.9, -1).gather(-1, mb.labels[0, :, None])[:, 0]
        state = load_file(f"{hf_dir}/model.safetensors")
        state = {k: v for k, v in state.items() if k in gathered or k != "lm_head.weight"}
        result = {
            "logits_max_abs_diff": float((logits[: sum(lens)] - ref).abs().max()),
            "logprob_max_abs_diff": float((lp - full_lp)[: sum(lens)].abs().max()),
            "weights_bit_exact": sorted(gathered) == sorted(state)
            and all(torch.equal(gathered[k], v) for k, v in state.items()),
        }
        with open(out_path, "w") as f:
            json.dump(result, f)
    ctx.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
