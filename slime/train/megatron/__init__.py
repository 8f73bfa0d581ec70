"""The megatron-core training backend (``--train-backend megatron``), for GPUs under torchrun.

    arch.py        HF config -> ModelArch (Llama, Qwen2, Qwen3 dense; Qwen3-MoE, Qwen2-MoE); clear error otherwise
    convert.py     HF <-> megatron-core weights per TP / EP / ETP rank, pure tensor code, bit-exact
    layers.py      slime's RMSNorm, SDPA core attention (RoPE inside, packed sequences), SwiGLU MLP, MoE router gate
    model.py       TransformerConfig + local layer spec (MoE layers too) -> GPTModel; loading HF weights per rank
    hf_reader.py   lazy per-tensor reads of an HF directory's safetensors
    router_metrics.py  hooks megatron-core's routers into slime.train.router_metrics (per-step MoE metrics)
    packing.py     optimizer step -> data-parallel shares -> packed micro-batches (token budget)
    logprobs.py    vocab-parallel logprobs / entropy with the rollout temperature (fused row passes)
    fusion.py      torch.compile of those passes and of RMSNorm / RoPE / SwiGLU on CUDA, eager elsewhere
    parallel.py    process groups (torchrun: TP, DP, CP, PP, EP, ETP), the rank-0 command channel
    context_parallel.py  CP without Transformer Engine: the sequence split, K/V all-gather attention
    weights.py     gathered HF tensors for weight sync and save_hf, one parameter at a time
    trainer.py     MegatronTrainer: TorchTrainer's interface over megatron's DDP and optimizer
    step.py        MegatronTrainStep: one train step on every rank, once the batch is there
    pipeline.py    packed micro-batches through megatron-core's pipeline schedule (1F1B)
    optimizer_step.py  reduce, skip a non-finite grad norm, clip and step megatron's optimizer
    step_metrics.py  the step's token-weighted metric sums, reduced over DP / PP ranks
    convert_cli.py slime convert: HF <-> megatron-core distributed checkpoint
    _mcore.py      importing megatron-core: the version range, its import warnings quieted

Needs the ``megatron`` extra (megatron-core >= 0.16; 0.16.1 is the newest for Python 3.11).
Modules that do not touch megatron-core (arch, convert, fusion, logprobs) import without it.
"""
