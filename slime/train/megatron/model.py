"""Build megatron-core's ``GPTModel`` for an HF Llama / Qwen2 / Qwen3 / Qwen3-MoE / Qwen2-MoE checkpoint, and load its weights.

The layer spec is megatron-core's local spec (``get_gpt_layer_local_spec``: ``ColumnParallelLinear``
/ ``RowParallelLinear``, no Transformer Engine, no Apex) with three modules swapped in from
``slime.train.megatron.layers``: HF-exact ``RMSNorm`` for every norm (hidden, final, q/k),
``SDPACoreAttention`` for the core attention and, once built, ``SwiGLUMLP`` (megatron's ``MLP``
with the gated SiLU fused) for every MLP; on CUDA their elementwise chains run as
``torch.compile`` kernels (``slime.train.megatron.fusion``). RoPE runs inside that attention, so the model is
built with ``position_embedding_type="none"`` and must be fed packed micro-batches
(``slime.train.megatron.packing``).

Everything megatron needs that the HF config does not say comes from ``MegatronConfig``
(parallel sizes, bf16, recompute). Context parallelism runs in ``SDPACoreAttention`` (K/V
all-gather, no Transformer Engine); under pipeline parallelism each stage builds its share of the
layers (``build_gpt_model``). Mapping (HF config -> ``TransformerConfig``)::

    num_hidden_layers -> num_layers             hidden_size -> hidden_size
    intermediate_size -> ffn_hidden_size        num_attention_heads -> num_attention_heads
    num_key_value_heads -> num_query_groups     head_dim -> kv_channels
    rms_norm_eps -> layernorm_epsilon           hidden_act silu -> gated_linear_unit + F.silu
    Qwen2, GLM attention_bias -> add_qkv_bias   Qwen3, GLM-4.5 use_qk_norm -> qk_layernorm
    GLM-4 post_self_attn / post_mlp_layernorm -> slime.train.megatron.post_norms
    tie_word_embeddings -> share_embeddings_and_output_weights (GPTModel argument)

MoE (Qwen3-MoE, Qwen2-MoE; ``slime.train.megatron.arch`` gives HF's routing)::

    num_experts -> num_moe_experts                   moe_intermediate_size -> moe_ffn_hidden_size
    num_experts_per_tok -> moe_router_topk           norm_topk_prob -> moe_router_pre_softmax = not it
    shared_expert_intermediate_size -> moe_shared_expert_intermediate_size, moe_shared_expert_gate
    decoder_sparse_step, mlp_only_layers -> moe_layer_freq (a per-layer 0/1 list)

with megatron-core's local MoE spec (``SequentialMLP`` experts: one ``MLP`` per local expert, no
grouped GEMM, which needs Transformer Engine or the grouped_gemm package), softmax scores, the
router in fp32 and the token dispatcher, aux-loss coefficient and capacity factor from
``MegatronConfig``. Experts split over ``expert_model_parallel_size`` ranks; each expert's
width over ``expert_tensor_parallel_size`` ranks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from slime.config import MegatronConfig
from slime.train.megatron._mcore import mcore
from slime.train.megatron.arch import ModelArch
from slime.train.megatron.convert import Ranks, hf_to_mcore_param, stage_names
from slime.train.megatron.deepseek_moe import named_weights, router_config_fields
from slime.train.megatron.hf_reader import HFCheckpointReader
from slime.train.megatron.layers import HiddenStatesOutput, RMSNorm, SDPACoreAttention, SwiGLUMLP, TorchGatingRouter
from slime.train.megatron.linear import use_local_linears
from slime.train.megatron.mla import mla_layer_spec
from slime.train.megatron.post_norms import add_post_norms

if TYPE_CHECKING:  # megatron-core ships no type information: these name its classes (mypy reads them as Any)
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = [
    "transformer_config", "layer_spec", "build_gpt_model", "load_hf_weights", "HFCheckpointReader", "output_hidden_states", "output_weight",
    "float16_wrapped",
]  # fmt: skip

log = logging.getLogger(__name__)


def transformer_config(
    arch: ModelArch,
    mcfg: MegatronConfig,
    *,
    use_cpu_initialization: bool = False,
    params_dtype: torch.dtype | None = None,
) -> TransformerConfig:
    """megatron-core ``TransformerConfig`` for ``arch`` under ``mcfg``'s parallelism and precision.

    Args:
        arch: the model.
        mcfg: parallel sizes, bf16, sequence parallel, recompute.
        use_cpu_initialization: allocate parameters on the CPU (CPU tests, conversion);
            otherwise on ``torch.cuda.current_device()``.
        params_dtype: parameter dtype (conversion keeps the checkpoint's); default: bf16 when
            ``mcfg.bf16``, else fp32.

    Raises:
        ValueError: a parallel size the backend does not run (pipeline or context > 1 on an MoE
            model; expert > 1 on a dense one), PP that does not divide the layers, or TP / EP / ETP
            that do not divide heads, widths or the expert count.
    """
    _check_parallel_sizes(arch, mcfg)
    configs = mcore("megatron.core.transformer.transformer_config")
    dtype = params_dtype or (torch.bfloat16 if mcfg.bf16 else torch.float32)
    return (configs.MLATransformerConfig if arch.mla else configs.TransformerConfig)(
        **(_model_fields(arch) | (arch.mla.config_fields(arch.rope_theta) if arch.mla else {})),  # MLA: deepseek.py
        **_parallel_fields(arch, mcfg),
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=False,  # every weight is loaded from the checkpoint
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,  # needs Apex / Transformer Engine kernels
        apply_rope_fusion=False,
        cuda_graph_scope=[],  # megatron-core 0.16.1 defaults to the deprecated "full" and warns about it
        # Sum gradients over data-parallel ranks instead of averaging: the RL loss is already
        # normalised by the whole optimizer step (slime.train.megatron.trainer).
        calculate_per_token_loss=True,
        recompute_granularity=mcfg.recompute_granularity,
        recompute_method=mcfg.recompute_method if mcfg.recompute_granularity == "full" else None,
        recompute_num_layers=(mcfg.recompute_num_layers or 1) if mcfg.recompute_granularity == "full" else None,
    )


def _check_parallel_sizes(arch: ModelArch, mcfg: MegatronConfig) -> None:
    """``transformer_config``'s ValueErrors (its docstring)."""
    cp, pp = mcfg.context_parallel_size, mcfg.pipeline_model_parallel_size
    if arch.is_moe and (cp > 1 or pp > 1):
        raise ValueError(
            f"--context-parallel-size={cp} / --pipeline-model-parallel-size={pp}: slime's megatron backend runs MoE models with TP, DP and EP only so far"
        )
    if arch.num_layers % pp:
        raise ValueError(f"--pipeline-model-parallel-size={pp} does not divide the model's {arch.num_layers} layers")
    arch.check_tensor_parallel(mcfg.tensor_model_parallel_size)
    if arch.is_moe and mcfg.tensor_model_parallel_size > 1 and not mcfg.sequence_parallel:
        raise ValueError(
            f"--tensor-model-parallel-size={mcfg.tensor_model_parallel_size} with an MoE model needs --sequence-parallel "
            "(megatron-core's MoE layer refuses to train under TP without it)"
        )
    arch.check_expert_parallel(mcfg.expert_model_parallel_size, mcfg.resolved_expert_tensor_parallel_size)


def _model_fields(arch: ModelArch) -> dict[str, object]:
    """The ``TransformerConfig`` fields of the architecture (no dropout, no biases but Qwen2's QKV)."""
    return dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_query_groups,
        kv_channels=arch.head_dim,
        layernorm_epsilon=arch.rms_norm_eps,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def _parallel_fields(arch: ModelArch, mcfg: MegatronConfig) -> dict[str, object]:
    """The ``TransformerConfig`` fields of ``mcfg``'s parallelism (and an MoE model's routing)."""
    cp, pp = mcfg.context_parallel_size, mcfg.pipeline_model_parallel_size
    return dict(
        tensor_model_parallel_size=mcfg.tensor_model_parallel_size,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        cp_comm_type="all_gather" if cp > 1 else None,  # what SDPACoreAttention does (layers.py)
        variable_seq_lengths=pp > 1,  # packed micro-batches differ in length: stages exchange shapes first
        expert_model_parallel_size=mcfg.expert_model_parallel_size,
        expert_tensor_parallel_size=mcfg.resolved_expert_tensor_parallel_size,
        # dense: no dispatcher runs; "allgather" refuses variable_seq_lengths
        **(_moe_config(arch, mcfg) if arch.is_moe else dict(moe_token_dispatcher_type="alltoall")),
        sequence_parallel=mcfg.sequence_parallel and mcfg.tensor_model_parallel_size > 1,
    )


def _moe_config(arch: ModelArch, mcfg: MegatronConfig) -> dict[str, object]:
    """The ``TransformerConfig`` fields of an MoE model (module docstring)."""
    return dict(
        num_moe_experts=arch.num_experts,
        moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
        moe_router_topk=arch.moe_router_topk,
        **(  # DeepSeek-style sigmoid routing (slime.train.megatron.deepseek_moe), else HF's softmax
            router_config_fields(arch.router, bias_update_rate=mcfg.moe_router_bias_update_rate)
            if arch.router
            else dict(moe_router_score_function="softmax", moe_router_pre_softmax=not arch.norm_topk_prob)
        ),
        moe_router_dtype="fp32",
        moe_layer_freq=arch.moe_layer_freq,
        moe_shared_expert_intermediate_size=arch.shared_expert_ffn_hidden_size or None,
        moe_shared_expert_gate=arch.shared_expert_gate,
        moe_grouped_gemm=False,
        moe_token_dispatcher_type=mcfg.moe_token_dispatcher_type,
        # seq_aux_loss comes with a coefficient of 0 (MegatronConfig.validate): the micro-batch loss is logged
        moe_router_load_balancing_type=mcfg.moe_router_load_balancing_type.replace("seq_aux_loss", "aux_loss"),
        moe_aux_loss_coeff=mcfg.moe_aux_loss_coeff if mcfg.moe_router_load_balancing_type != "none" else 0.0,
        moe_expert_capacity_factor=mcfg.moe_expert_capacity_factor,
        moe_token_drop_policy="probs",
        moe_permute_fusion=False,
        moe_router_fusion=False,
    )


def layer_spec(*, num_experts: int | None = None) -> ModuleSpec:
    """megatron-core's local GPT layer spec with slime's RMSNorm and SDPA core attention swapped in.

    The MLP stays megatron's ``MLP`` here (``TransformerLayer`` passes its TP group only to that
    exact class); ``build_gpt_model`` turns the built ones into ``SwiGLUMLP``. With
    ``num_experts`` the MLP is megatron's ``MoELayer`` (router, ``SequentialMLP`` experts, shared
    expert when the config has one)."""
    spec = mcore("megatron.core.models.gpt.gpt_layer_specs").get_gpt_layer_local_spec(
        num_experts=num_experts, moe_grouped_gemm=False, normalization="RMSNorm", qk_layernorm=True
    )
    sub = spec.submodules
    sub.input_layernorm = RMSNorm
    sub.pre_mlp_layernorm = RMSNorm
    attn = sub.self_attention.submodules
    attn.core_attention = SDPACoreAttention
    attn.q_layernorm = RMSNorm
    attn.k_layernorm = RMSNorm
    return spec


def build_gpt_model(arch: ModelArch, config: TransformerConfig, *, tp_size: int, pp_rank: int = 0) -> GPTModel:
    """A ``GPTModel`` (one pipeline stage: all layers without PP) with uninitialised weights.

    ``config`` comes from ``transformer_config``; megatron's parallel state must be initialised
    (the model reads its TP and PP groups). Q/K norms are built only for Qwen3 (``config.qk_layernorm``).
    The block spec names ``RMSNorm`` for the final norm too (megatron's default would be torch's).
    An MoE model gets the MoE spec on its MoE layers and the dense one elsewhere.

    Under pipeline parallelism (``config.pipeline_model_parallel_size`` = P) stage ``pp_rank``
    builds layers ``[pp_rank * L / P, (pp_rank + 1) * L / P)`` (megatron-core's even split, as
    ``get_gpt_decoder_block_spec`` slices it), stage 0 the embedding, stage P - 1 the final norm
    and output layer (a copy of the embedding when tied, kept equal by megatron's gradient sum).
    """
    gpt = mcore("megatron.core.models.gpt")
    TransformerBlockSubmodules = mcore("megatron.core.transformer.transformer_block").TransformerBlockSubmodules
    spec_of = mla_layer_spec if arch.mla else layer_spec
    specs = {False: spec_of(), True: spec_of(num_experts=arch.num_experts) if arch.is_moe else None}
    for spec in specs.values():
        if spec is not None and not arch.qk_norm and not arch.mla:
            spec.submodules.self_attention.submodules.q_layernorm = None
            spec.submodules.self_attention.submodules.k_layernorm = None
    moe_layers = arch.moe_layers or (False,) * arch.num_layers
    pp = config.pipeline_model_parallel_size
    per_stage = arch.num_layers // pp
    stage_layers = moe_layers[pp_rank * per_stage : (pp_rank + 1) * per_stage]
    block = TransformerBlockSubmodules(layer_specs=[specs[m] for m in stage_layers], layer_norm=RMSNorm)
    model = gpt.GPTModel(
        config=config,
        transformer_layer_spec=block,
        vocab_size=arch.padded_vocab_size(tp_size),
        max_sequence_length=arch.max_position_embeddings,
        pre_process=pp_rank == 0,
        post_process=pp_rank == pp - 1,
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="none",
    )
    if arch.post_norms:
        add_post_norms(model, config)
    if not config.use_cpu_initialization:  # megatron-core allocates the MoE router and shared-expert gate on the CPU
        model.cuda(torch.cuda.current_device())  # moves those only; same Parameter objects, attributes kept
    mark_tensor_parallel_weights(model, config)
    use_fused_swiglu(model)
    use_local_linears(model)
    return model


def use_fused_swiglu(model: torch.nn.Module) -> None:
    """Make every megatron ``MLP`` in ``model`` a ``SwiGLUMLP`` (a subclass that only replaces
    ``forward``, same state): its gated SiLU runs as one fused function. Every ``TopKRouter``
    becomes a ``TorchGatingRouter`` the same way (its gate runs without Transformer Engine)."""
    MLP = mcore("megatron.core.transformer.mlp").MLP
    TopKRouter = mcore("megatron.core.transformer.moe.router").TopKRouter
    for module in model.modules():
        if type(module) is MLP:
            module.__class__ = SwiGLUMLP
        elif type(module) is TopKRouter:
            module.__class__ = TorchGatingRouter


def output_hidden_states(model: torch.nn.Module) -> None:
    """Make ``model``'s output layer (last pipeline stage) a ``HiddenStatesOutput``, which returns its
    input: the model's forward then returns the final norm's output [b, s, h] in place of the logits
    [b, s, v] (``--logprob-impl liger`` computes logprobs from it and ``output_weight``).

    Same class swap as ``use_fused_swiglu``: the layer keeps its weight (trained, saved and synced
    as before, used by the logprob function instead of by the layer). TP = 1 only: under TP the
    layer would also copy or gather its input across the TP group. No-op on an earlier stage.
    """
    ColumnParallelLinear = mcore("megatron.core.tensor_parallel").ColumnParallelLinear
    layer = getattr(_gpt_model(model), "output_layer", None)
    if type(layer) is ColumnParallelLinear:
        layer.__class__ = HiddenStatesOutput


def output_weight(model: torch.nn.Module) -> torch.Tensor:
    """The output-layer weight [v, h] of ``model`` (a GPTModel, its last pipeline stage, maybe
    wrapped in DDP / ``Float16Module``): the word embedding when tied and this stage embeds,
    else the output layer's (megatron's ``shared_embedding_or_output_weight``)."""
    gpt = _gpt_model(model)
    return (
        gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights else gpt.output_layer.weight
    )


def float16_wrapped(model: torch.nn.Module) -> bool:
    """Whether ``model`` is, or wraps (DDP's ``.module`` chain), megatron's ``Float16Module``."""
    wrapper = mcore("megatron.core.transformer.module").Float16Module
    inner: object = model
    while inner is not None:
        if isinstance(inner, wrapper):
            return True
        inner = getattr(inner, "module", None)
    return False


def _gpt_model(model: torch.nn.Module) -> GPTModel:
    """``model`` without its wrappers (DDP, ``Float16Module``: each holds the next as ``.module``)."""
    gpt_class = mcore("megatron.core.models.gpt").GPTModel
    inner: object = model
    while not isinstance(inner, gpt_class):
        inner = getattr(inner, "module")  # noqa: B009  # the wrappers' attribute (DDP, Float16Module)
    return inner


def mark_tensor_parallel_weights(model: torch.nn.Module, config: TransformerConfig) -> None:
    """Tag the weights of megatron's TP layers as TP-sharded (``tensor_model_parallel``, ``partition_dim``,
    ``partition_stride``), as megatron's weight init would.

    With ``perform_initialization=False`` megatron-core skips ``_initialize_affine_weight_*``, which is
    also where those attributes are set (biases get them regardless). Untagged, every TP rank's
    weight shard counts as a replica of rank 0's, so ``get_grad_norm`` counted only rank 0's shards:
    under TP=2 the reported norm was about 1/sqrt(2) of the 1-GPU norm and clipping used it.
    Column-parallel weights (and the vocab-parallel embedding) split dim 0, row-parallel dim 1;
    the gated ``linear_fc1`` has stride 2 (megatron's ``MLP``).
    """
    tp = mcore("megatron.core.tensor_parallel")
    for name, module in model.named_modules():
        if isinstance(module, (tp.ColumnParallelLinear, tp.VocabParallelEmbedding)):
            dim = 0
        elif isinstance(module, tp.RowParallelLinear):
            dim = 1
        else:
            continue
        weight = getattr(module, "weight", None)
        if weight is None or hasattr(weight, "tensor_model_parallel"):
            continue
        stride = 2 if name.endswith("linear_fc1") and config.gated_linear_unit else 1
        tp.set_tensor_model_parallel_attributes(weight, True, dim, stride)


def load_hf_weights(
    model: torch.nn.Module, reader: HFCheckpointReader, arch: ModelArch, *, tp_size: int, tp_rank: int,
    ep_size: int = 1, ep_rank: int = 0, etp_size: int | None = None, etp_rank: int | None = None,
    pp_size: int = 1, pp_rank: int = 0,
) -> None:  # fmt: skip
    """Copy this rank's share of the HF weights into ``model`` (a ``GPTModel``), one tensor at a time.

    Args:
        tp_size / tp_rank, ep_size / ep_rank, etp_size / etp_rank: this rank's place in the tensor,
            expert and expert-tensor parallel groups (``convert.hf_to_mcore_param``); an MoE
            rank reads only its own experts.
        pp_size / pp_rank: the pipeline stage ``model`` is (``convert.stage_names``); it reads
            only its own layers.

    Raises:
        KeyError: an HF tensor is missing. RuntimeError: the model's parameter set or a shape
            differs from what the conversion produces, or a tensor is stored in fp8 (its scales unread).
    """
    params = named_weights(model)  # with the routers' expert bias (DeepSeek-style MoE)
    names = stage_names(arch, pp_size=pp_size, pp_rank=pp_rank, ep_size=ep_size)  # local -> global
    expected = list(names)
    missing, extra = sorted(set(expected) - set(params)), sorted(set(params) - set(expected))
    if missing or extra:
        raise RuntimeError(f"megatron model and converter disagree: missing in model {missing}, not converted {extra}")
    ranks = Ranks(
        tp_size=tp_size, tp_rank=tp_rank, ep_size=ep_size, ep_rank=ep_rank, etp_size=etp_size, etp_rank=etp_rank
    )
    with torch.no_grad():
        for name in expected:
            value = hf_to_mcore_param(names[name], reader.__getitem__, arch, **ranks)
            # an fp8 tensor (one-byte float): its scales are other tensors, so copying its raw values loads wrong weights
            if value.dtype.is_floating_point and value.dtype.itemsize == 1:
                raise RuntimeError(
                    f"{name}: the checkpoint stores {value.dtype} weights; convert it to bf16 first (ModelArch refuses "
                    "a config with quantization_config; this one has none)"
                )
            param = params[name]
            if tuple(value.shape) != tuple(param.shape):
                raise RuntimeError(
                    f"{name}: converted shape {tuple(value.shape)} != model shape {tuple(param.shape)} ({ranks})"
                )
            param.copy_(value)
