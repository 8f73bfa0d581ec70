"""The decoder architectures the megatron backend builds, read from an HF ``config.json``.

Dense: Llama (``LlamaForCausalLM``), Qwen2 (``Qwen2ForCausalLM``: qkv bias) and Qwen3
(``Qwen3ForCausalLM``: RMSNorm on each query/key head). Mixture of experts: Qwen3-MoE
(``Qwen3MoeForCausalLM``: Qwen3 attention, top-k routed SwiGLU experts) and Qwen2-MoE
(``Qwen2MoeForCausalLM``: Qwen2 attention, routed experts plus one shared expert whose output is
scaled by ``sigmoid(shared_expert_gate(x))``, the DeepSeek-V3-style "shared + routed" layout).
GLM-4 (``Glm4ForCausalLM``: q/k/v bias, partial interleaved RoPE, post-attention and post-MLP
norms; ``slime.train.megatron.glm``) and GLM-4.5 to 4.7 (``Glm4MoeForCausalLM``: q/k/v bias, partial
RoPE, optional q/k norm, DeepSeek-V3's sigmoid router and MoE layout, ``slime.train.megatron.deepseek_moe``;
its multi-token-prediction layers past ``num_hidden_layers`` are not read). DeepSeek-V3 / Kimi-K2
(``DeepseekV3ForCausalLM``: multi-latent attention with YaRN, the same MoE layout; ``slime.train.megatron.deepseek``)
and GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``: DeepSeek-V3's layers, GLM's dense/MoE layer list; ``slime.train.megatron.glm_lite``).
All are pre-norm decoders with RMSNorm and SwiGLU MLPs; all but DeepSeek-V3 use grouped-query
attention and RoPE (``rope_type`` "default"); embeddings may be tied to the output layer. Anything
else (sliding windows, RoPE scaling other than DeepSeek-V3's YaRN, biases on the output projection
or MLP) raises ``UnsupportedArchitecture`` naming the field, rather than building a model that
silently differs from the HF one.

Routing, as HF computes it for both MoE families: ``p = softmax(router(x))`` in fp32, the top
``num_experts_per_tok`` of ``p`` are kept, and with ``norm_topk_prob`` divided by their sum. The
megatron model reproduces that with ``moe_router_score_function="softmax"`` and
``moe_router_pre_softmax = not norm_topk_prob`` (top-k of the logits then a softmax over the k
kept equals the renormalised top-k of the full softmax). A layer is an MoE layer when
``num_experts > 0``, ``(i + 1) % decoder_sparse_step == 0`` and ``i not in mlp_only_layers``;
the others are dense SwiGLU layers of ``intermediate_size``.

Example: Qwen2-0.5B -> ``ModelArch(family="qwen2", num_layers=24, hidden_size=896,
num_attention_heads=14, num_query_groups=2, head_dim=64, ffn_hidden_size=4864,
vocab_size=151936, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, qkv_bias=True,
qk_norm=False)``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Literal

from slime.hf_checkpoint import check_hf_dir
from slime.hf_config_defaults import with_transformers_defaults
from slime.train.megatron.deepseek import MLAArch, deepseek_v3_fields
from slime.train.megatron.deepseek_moe import SigmoidRouter, deepseek_moe_fields
from slime.train.megatron.glm_lite import glm4_moe_lite_layers

__all__ = ["ModelArch", "UnsupportedArchitecture", "SUPPORTED_MODEL_TYPES", "load_hf_config"]

SUPPORTED_MODEL_TYPES = (
    "llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "deepseek_v3", "glm4", "glm4_moe", "glm4_moe_lite",
)  # fmt: skip
log = logging.getLogger(__name__)
MOE_MODEL_TYPES = ("qwen3_moe", "qwen2_moe", "glm4_moe")


class UnsupportedArchitecture(ValueError):
    """The HF config describes a model the megatron backend does not build (named in the message)."""


def _check_not_quantized(config: Mapping[str, object], arch_names: object) -> None:
    """Refuse a quantized checkpoint (``quantization_config``: DeepSeek-V3's and Kimi-K2's released fp8 weights,
    each with a ``weight_scale_inv`` per 128x128 block). Copying its fp8 values without their scales would load
    weights off by the scale (x700 in a review's test) with no error.

    Raises:
        UnsupportedArchitecture: naming the method and what to do instead.
    """
    quant = config.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, Mapping) else quant
        raise UnsupportedArchitecture(
            f"{arch_names}: a quantized checkpoint (quantization_config.quant_method={method!r}); the megatron "
            "backend trains bf16/fp32 weights: convert it to bf16 first (e.g. inference/fp8_cast_bf16.py of the "
            "DeepSeek-V3 repository) and pass that directory as --hf-checkpoint"
        )


@dataclasses.dataclass(frozen=True)
class ModelArch:
    """Shape and options of one decoder, enough to build it and to convert its weights.

    Attributes:
        family: HF ``model_type``: "llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "deepseek_v3", "glm4",
            "glm4_moe" or "glm4_moe_lite".
        num_layers / hidden_size / ffn_hidden_size: layer count, model width, SwiGLU width of the
            dense layers.
        num_attention_heads / num_query_groups: query heads and key/value heads (GQA groups).
        head_dim: channels per head (``kv_channels``; Qwen3 may differ from hidden / heads).
        vocab_size: rows of the HF embedding (the megatron one is padded, ``padded_vocab_size``).
        rope_theta: RoPE base. rms_norm_eps: epsilon of every RMSNorm.
        tie_word_embeddings: the output layer reuses the input embedding.
        qkv_bias: q/k/v projections carry a bias (Qwen2). qk_norm: RMSNorm on q and k heads (Qwen3).
        max_position_embeddings: from the config; bounds nothing here, kept for the megatron model.
        num_experts: routed experts per MoE layer (0: a dense model).
        moe_ffn_hidden_size: SwiGLU width of one routed expert (``moe_intermediate_size``).
        moe_router_topk: experts per token (``num_experts_per_tok``).
        norm_topk_prob: the k kept routing probabilities are renormalised to sum to 1.
        shared_expert_ffn_hidden_size: SwiGLU width of the shared expert (0: none).
        shared_expert_gate: the shared expert's output is scaled by ``sigmoid(x @ gate)`` (Qwen2-MoE).
        moe_layers: per layer, whether it is an MoE layer (empty for a dense model).
        rotary_dim: channels of each q/k head RoPE rotates (``head_dim * partial_rotary_factor``;
            0 = all of ``head_dim``). rope_interleaved: RoPE rotates adjacent channel pairs (GLM-4).
        post_norms: RMSNorm on the attention and MLP outputs before each residual add (GLM-4).
            These three: ``slime.train.megatron.glm``.
        router: DeepSeek-style sigmoid routing with expert bias (None: softmax; ``deepseek_moe``).
        mla: multi-latent attention's shape (None: grouped-query attention; ``deepseek``).
    """

    family: Literal[
        "llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "deepseek_v3", "glm4", "glm4_moe", "glm4_moe_lite"
    ]
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    max_position_embeddings: int
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    moe_router_topk: int = 0
    norm_topk_prob: bool = False
    shared_expert_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False
    moe_layers: tuple[bool, ...] = ()
    rotary_dim: int = 0
    rope_interleaved: bool = False
    post_norms: bool = False
    router: SigmoidRouter | None = None
    mla: MLAArch | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layer_freq(self) -> list[int]:
        """megatron-core's ``moe_layer_freq`` as a per-layer list: 1 = MoE layer, 0 = dense layer."""
        return [int(m) for m in self.moe_layers]

    def check_expert_parallel(self, expert_model_parallel_size: int, expert_tensor_parallel_size: int) -> None:
        """Raise ValueError unless the experts split evenly over EP ranks and each expert's width over ETP ranks.

        Raises:
            ValueError: EP > 1 on a dense model, EP not dividing ``num_experts``, or ETP not dividing
                ``moe_ffn_hidden_size``.
        """
        ep, etp = expert_model_parallel_size, expert_tensor_parallel_size
        if not self.is_moe:  # ETP (default: the TP size) splits nothing here
            if ep != 1:
                raise ValueError(f"--expert-model-parallel-size={ep}: this {self.family} model has no experts")
            return
        if self.num_experts % ep:
            raise ValueError(
                f"--expert-model-parallel-size={ep} must divide num_experts={self.num_experts} of this {self.family} model"
            )
        if self.moe_ffn_hidden_size % etp:
            raise ValueError(
                f"--expert-tensor-parallel-size={etp} must divide moe_intermediate_size={self.moe_ffn_hidden_size} of this {self.family} model"
            )

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    def padded_vocab_size(self, tensor_model_parallel_size: int) -> int:
        """Vocabulary rounded up to a multiple of the TP size (megatron splits it evenly).

        Padded rows are zero in the embedding and in the output layer, and their logits are
        masked to -inf before any softmax (``slime.train.megatron.logprobs``).
        """
        tp = tensor_model_parallel_size
        return -(-self.vocab_size // tp) * tp

    def check_tensor_parallel(self, tensor_model_parallel_size: int) -> None:
        """Raise ValueError unless heads and SwiGLU width split evenly over ``tensor_model_parallel_size``."""
        tp = tensor_model_parallel_size
        problems = [
            f"num_attention_heads={self.num_attention_heads}" if self.num_attention_heads % tp else "",
            f"ffn_hidden_size={self.ffn_hidden_size}" if self.ffn_hidden_size % tp else "",
            f"num_key_value_heads={self.num_query_groups}"
            if self.num_query_groups % tp and tp % self.num_query_groups
            else "",
        ]
        if self.mla is not None:  # its down projections are column-parallel too
            problems += [f"q_lora_rank={self.mla.q_lora_rank}"] if self.mla.q_lora_rank % tp else []
            down = self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
            problems += [f"kv_lora_rank + qk_rope_head_dim={down}"] if down % tp else []
        problems = [p for p in problems if p]
        if self.shared_expert_ffn_hidden_size % tp:
            problems.append(f"shared_expert_intermediate_size={self.shared_expert_ffn_hidden_size}")
        if problems:
            raise ValueError(
                f"--tensor-model-parallel-size={tp} must divide {', '.join(problems)} of this {self.family} model"
            )

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelArch:
        """Read a ``config.json`` dict (or ``PretrainedConfig.to_dict()``; a key it lacks: transformers' default).

        Raises:
            UnsupportedArchitecture: another ``model_type``, a quantized checkpoint, or an option not built here.
        """
        config = with_transformers_defaults(config)  # slime.hf_config_defaults
        model_type = config.get("model_type")
        arch_names = config.get("architectures") or [model_type]
        _check_not_quantized(config, arch_names)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedArchitecture(
                f"the megatron backend builds {', '.join(SUPPORTED_MODEL_TYPES)} decoders; this checkpoint is "
                f"model_type={model_type!r} (architectures={arch_names})"
            )
        if model_type in ("deepseek_v3", "glm4_moe_lite"):  # multi-latent attention
            try:  # GLM-4.7-Flash: DeepSeek-V3's layers, its own list of dense layers (slime.train.megatron.glm_lite)
                layers = glm4_moe_lite_layers(config) if model_type == "glm4_moe_lite" else None
                return cls(**deepseek_v3_fields(config, model_type, moe_layers=layers))
            except ValueError as exc:
                raise UnsupportedArchitecture(f"{arch_names}: {exc}") from exc
        heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
        head_dim = int(config.get("head_dim") or hidden // heads)
        rope = _rope_theta(config, model_type)
        unsupported = {
            "hidden_act": (config.get("hidden_act", "silu"), "silu"),
            "mlp_bias": (bool(config.get("mlp_bias") or False), False),
            "use_sliding_window": (bool(config.get("use_sliding_window") or False), False),
        }
        moe = model_type in MOE_MODEL_TYPES
        if not moe:
            unsupported["num_experts"] = (config.get("num_experts") or config.get("num_local_experts") or 0, 0)
        if model_type in ("llama", "qwen3", "qwen3_moe"):  # their attention_bias also puts a bias on o_proj
            unsupported["attention_bias"] = (bool(config.get("attention_bias") or False), False)
        for field, (value, want) in unsupported.items():
            if value != want:
                raise UnsupportedArchitecture(
                    f"{model_type} ({arch_names}) with {field}={value!r} is not supported: expected {want!r}"
                )
        return cls(
            family=model_type,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            ffn_hidden_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_query_groups=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            vocab_size=int(config["vocab_size"]),
            rope_theta=rope,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=_qkv_bias(config, model_type),
            qk_norm=model_type in ("qwen3", "qwen3_moe") or bool(config.get("use_qk_norm") or False),
            max_position_embeddings=int(config.get("max_position_embeddings") or 4096),
            **(_moe_fields(config, model_type) if moe else {}),
            rotary_dim=_rotary_dim(config, head_dim),
            rope_interleaved=model_type == "glm4",  # HF's Glm4 rotate_half pairs channels 2j, 2j + 1
            post_norms=model_type == "glm4",
        )


def _qkv_bias(config: Mapping[str, Any], model_type: str) -> bool:
    """Qwen2's q/k/v bias (``qkv_bias``, default on) or GLM's (``attention_bias``: q/k/v only, no o_proj bias)."""
    if model_type in ("qwen2", "qwen2_moe"):
        return bool(config.get("qkv_bias", True))
    return model_type.startswith("glm4") and bool(config.get("attention_bias") or False)


def _rotary_dim(config: Mapping[str, Any], head_dim: int) -> int:
    """``head_dim * partial_rotary_factor`` (in ``rope_parameters`` with transformers 5, top-level before)."""
    params = config.get("rope_parameters") or {}
    factor = float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) or 1.0)
    return int(head_dim * factor)


def _moe_fields(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The MoE attributes of ``ModelArch`` from a Qwen3-MoE / Qwen2-MoE config (module docstring), or GLM-4.5's."""
    if model_type == "glm4_moe":  # DeepSeek-V3's MoE layout and router (slime.train.megatron.deepseek_moe)
        try:
            return deepseek_moe_fields(config, model_type)
        except ValueError as exc:
            raise UnsupportedArchitecture(f"{config.get('architectures') or model_type}: {exc}") from exc
        if mtp := int(config.get("num_nextn_predict_layers") or 0):
            log.info("%s: %d multi-token-prediction layer(s) in the checkpoint are not read", model_type, mtp)
    num_experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    num_layers = int(config["num_hidden_layers"])
    step = int(config.get("decoder_sparse_step") or 1)
    dense = set(config.get("mlp_only_layers") or ())
    layers = tuple(num_experts > 0 and (i + 1) % step == 0 and i not in dense for i in range(num_layers))
    shared = int(config.get("shared_expert_intermediate_size") or 0) if model_type == "qwen2_moe" else 0
    if not any(layers):
        raise UnsupportedArchitecture(
            f"{model_type} with num_experts={num_experts} and no MoE layer: expected at least one"
        )
    return dict(
        num_experts=num_experts,
        moe_ffn_hidden_size=int(config["moe_intermediate_size"]),
        moe_router_topk=int(config["num_experts_per_tok"]),
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        shared_expert_ffn_hidden_size=shared,
        shared_expert_gate=shared > 0,
        moe_layers=layers,
    )


def _rope_theta(config: Mapping[str, Any], model_type: str) -> float:
    """RoPE base from ``rope_parameters`` (transformers 5) or ``rope_theta`` / ``rope_scaling`` (4.x)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise UnsupportedArchitecture(
            f"{model_type} with rope_type={rope_type!r} is not supported: expected 'default' RoPE"
        )
    theta = params.get("rope_theta", config.get("rope_theta"))
    return float(theta if theta is not None else 10000.0)


def load_hf_config(model_dir: str) -> dict[str, Any]:
    """The ``config.json`` of an HF model directory, as a dict.

    Raises:
        CheckpointError: no such directory or config, or invalid JSON (``slime.hf_checkpoint.check_hf_dir``).
    """
    check_hf_dir(model_dir, weights=False)
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)
