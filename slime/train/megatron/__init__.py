"""The megatron-core training backend (``--train-backend megatron``), for GPUs under torchrun.

    arch.py        HF config -> ModelArch (Llama, Qwen2, Qwen3 dense); clear error otherwise
    convert.py     HF <-> megatron-core weights per TP rank, pure tensor code, bit-exact
    layers.py      slime's RMSNorm, SDPA core attention (RoPE inside, packed sequences), SwiGLU MLP
    model.py       TransformerConfig + local layer spec -> GPTModel; loading HF weights per rank
    packing.py     optimizer step -> data-parallel shares -> packed micro-batches (token budget)
    logprobs.py    vocab-parallel logprobs / entropy with the rollout temperature (fused row passes)
    fusion.py      torch.compile of those passes and of RMSNorm / RoPE / SwiGLU on CUDA, eager elsewhere
    parallel.py    process groups (torchrun), the rank-0 command channel
    weights.py     gathered HF tensors for weight sync and save_hf, one parameter at a time
    trainer.py     MegatronTrainer: TorchTrainer's interface over megatron's DDP and optimizer
    convert_cli.py slime convert: HF <-> megatron-core distributed checkpoint

Needs the ``megatron`` extra (megatron-core >= 0.16; 0.16.1 is the newest for Python 3.11).
Modules that do not touch megatron-core (arch, convert, fusion, logprobs) import without it.
"""
