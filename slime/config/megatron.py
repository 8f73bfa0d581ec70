"""``MegatronConfig``: the megatron-core backend's knobs (``TrainConfig.megatron``; ``slime.train.megatron``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from slime.config._base import STRUCT, Range, check_ranges, require

__all__ = ["MegatronConfig"]


class MegatronConfig(msgspec.Struct, **STRUCT):
    """The megatron-core backend's knobs (``--train-backend megatron``), spelled as Megatron-LM's flags.

    Algorithm, batch sizes, lr, weight decay, Adam betas and gradient clipping stay in
    ``TrainConfig`` and are shared with the torch backend; ``slime/train/megatron/parallel.py``
    maps both onto megatron-core's ``TransformerConfig``, ``OptimizerConfig`` and
    ``DistributedDataParallelConfig``. World size is only known under torchrun, so products of
    parallel sizes are checked there, not here.
    """

    tensor_model_parallel_size: Annotated[int, Range(ge=1)] = 1
    """Tensor-parallel ranks per model replica (``--tensor-model-parallel-size``)."""
    pipeline_model_parallel_size: Annotated[int, Range(ge=1)] = 1
    """Pipeline stages (``--pipeline-model-parallel-size``): megatron-core's 1F1B schedule over
    consecutive layers (must divide the layer count; dense models only)."""
    context_parallel_size: Annotated[int, Range(ge=1)] = 1
    """Context-parallel ranks (``--context-parallel-size``): each sequence split over them in
    2 x CP load-balanced chunks, K/V all-gathered in attention (``slime.train.megatron.context_parallel``;
    dense models only)."""
    expert_model_parallel_size: Annotated[int, Range(ge=1)] = 1
    """Expert-parallel ranks (``--expert-model-parallel-size``): an MoE layer's routed experts are
    split evenly over them (must divide ``num_experts``); > 1 only for MoE models."""
    expert_tensor_parallel_size: (
        Annotated[int, Range(ge=1, note=", or unset (= --tensor-model-parallel-size)")] | None
    ) = None
    """Tensor-parallel ranks inside one expert (``--expert-tensor-parallel-size``): each expert's
    SwiGLU width is split over them. None = ``tensor_model_parallel_size`` (Megatron-LM's default)."""
    moe_token_dispatcher_type: Literal["alltoall", "allgather"] = "alltoall"
    """How routed tokens reach the expert-parallel rank holding their expert
    (``--moe-token-dispatcher-type``): all-to-all of only the routed tokens, or an all-gather of
    every token (megatron-core's two dispatchers that run without Transformer Engine)."""
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "none"] = "aux_loss"
    """Load-balancing loss added to the router's gradient (``--moe-router-load-balancing-type``):
    Switch Transformer's (arXiv 2101.03961) over each micro-batch, or "none". Takes effect only
    with ``moe_aux_loss_coeff`` > 0; the unscaled value is logged either way. megatron's
    "seq_aux_loss" (slime's DeepSeek / GLM model scripts, with ``--moe-aux-loss-coeff 0``) is accepted
    with a coefficient of 0 only, where it trains nothing and the micro-batch loss is logged: on slime's
    packed micro-batches a per-sequence loss would see one sequence."""
    moe_aux_loss_coeff: Annotated[float, Range(ge=0)] = 0.0
    """Weight of the load-balancing loss (``--moe-aux-loss-coeff``); 0 = not trained, only logged.
    Averaged over the optimizer step's tokens, as the RL loss is."""
    moe_router_bias_update_rate: Annotated[float, Range(ge=0)] = 1e-3
    """Step of the DeepSeek-style expert-bias update per optimizer step (``--moe-router-bias-update-rate``;
    megatron's default; 0 keeps the checkpoint's ``e_score_correction_bias``, as slime's DeepSeek-V3,
    Kimi-K2 and GLM-4.5 scripts do). Only sigmoid routers with an expert bias have one
    (``slime.train.megatron.deepseek_moe``)."""
    moe_expert_capacity_factor: Annotated[float, Range(gt=0, note=", or unset (dropless)")] | None = None
    """Expert capacity, in multiples of the even share ``tokens * topk / num_experts``
    (``--moe-expert-capacity-factor``); tokens over capacity are dropped (lowest routing
    probability first) and counted in ``moe_dropped_token_frac``. None = dropless."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism over the tensor-parallel group (``--sequence-parallel``)."""
    use_dynamic_batch_size: bool = False
    """Pack micro-batches by ``max_tokens_per_gpu`` instead of ``micro_batch_size`` samples
    (``--use-dynamic-batch-size``). Also read by the torch backend, whose micro-batches are padded:
    there the budget bounds samples x longest sample of each micro-batch (``slime.train.batch.pack_by_token_budget``)."""
    max_tokens_per_gpu: Annotated[int, Range(ge=1)] = 16384
    """Token budget of one packed micro-batch on one GPU (``--max-tokens-per-gpu``); a longer
    sample gets a micro-batch of its own."""
    min_lr: Annotated[float, Range(ge=0)] = 0.0
    """Floor of the decayed learning rate (``--min-lr``)."""
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root"] = "constant"
    """Learning-rate schedule over optimizer steps (``--lr-decay-style``), megatron-core's
    ``OptimizerParamScheduler``; the torch backend follows it too (``slime.train.lr_schedule``), as it
    does ``--min-lr``, ``--lr-warmup-iters`` and ``--lr-decay-iters``."""
    lr_warmup_iters: Annotated[int, Range(ge=0)] = 0
    """Linear warm-up, in optimizer steps (``--lr-warmup-iters``)."""
    lr_warmup_fraction: Annotated[float, Range(ge=0, lt=1)] | None = None
    """Warm-up as a fraction of the decay steps (``--lr-warmup-fraction``, Megatron's): when the run's
    optimizer steps are known, ``lr_warmup_iters = round(fraction x (lr_decay_iters or the run's
    optimizer steps))`` (``slime.train.lr_schedule.resolve_lr_schedule``)."""
    lr_decay_iters: Annotated[int, Range(ge=1, note=", or unset")] | None = None
    """Optimizer steps over which lr decays to ``min_lr`` (``--lr-decay-iters``); None = no decay."""
    adam_eps: Annotated[float, Range(gt=0)] = 1e-8
    """Adam epsilon (``--adam-eps``)."""
    bf16: bool = False
    """bf16 training (``--bf16``); off = fp32. megatron: bf16 parameters and activations, fp32 master
    weights and grads. torch backend: fp32 parameters, grads and AdamW state (the master weights),
    forward and backward under ``torch.autocast(dtype=torch.bfloat16)``."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state over data-parallel ranks (``--use-distributed-optimizer``)."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduce with the backward pass (``--overlap-grad-reduce``)."""
    recompute_granularity: Literal["full", "selective"] | None = None
    """Activation recomputation (``--recompute-granularity``); None = keep all activations."""
    recompute_method: Literal["uniform", "block"] | None = None
    """With ``full`` recompute: how layers are grouped (``--recompute-method``)."""
    recompute_num_layers: Annotated[int, Range(ge=1, note=", or unset")] | None = None
    """With ``full`` recompute: layers per group (uniform) or recomputed layers per stage (block)
    (``--recompute-num-layers``)."""
    logprob_impl: Literal["slime", "liger"] = "slime"
    """How the trainer gets token logprobs and entropies from the last hidden states
    (``--logprob-impl``, after Megatron's ``--cross-entropy-fusion-impl``): "slime" = the output
    layer's logits, then slime's two-pass autograd function (``slime.train.megatron.logprobs``);
    "liger" = liger-kernel's fused linear + scaled cross entropy from the hidden states and the
    output weight, chunked, never materialising the [tokens, vocabulary] logits (needs
    ``slime[liger]``; TP = 1 only; on H100/H200 its CuTe DSL kernel needs ``--bf16`` and
    nvidia-cutlass-dsl)."""
    distributed_timeout_minutes: Annotated[int, Range(ge=1)] = 30
    """Timeout of collective operations between train ranks (``--distributed-timeout-minutes``)."""

    @property
    def resolved_expert_tensor_parallel_size(self) -> int:
        """``expert_tensor_parallel_size``, or the TP size when it is None."""
        etp = self.expert_tensor_parallel_size
        return self.tensor_model_parallel_size if etp is None else etp

    def validate(self) -> None:
        """Check this section's values (products of parallel sizes are checked under torchrun).

        Raises:
            ConfigError: naming the flag.
        """
        m = self
        check_ranges(m)
        require(
            [
                (
                    m.lr_warmup_fraction is None or m.lr_warmup_iters == 0,
                    "--lr-warmup-fraction with --lr-warmup-iters",
                    f"{m.lr_warmup_fraction} and {m.lr_warmup_iters}",
                    "one of them (as in Megatron)",
                ),
                (
                    m.moe_router_load_balancing_type != "seq_aux_loss" or m.moe_aux_loss_coeff == 0,
                    "--moe-router-load-balancing-type seq_aux_loss with --moe-aux-loss-coeff",
                    m.moe_aux_loss_coeff,
                    "aux_loss (per micro-batch) for a trained balancing loss, or a coefficient of 0",
                ),
            ]
        )
