"""The dense decoder architectures the megatron backend builds, read from an HF ``config.json``.

Supported: Llama (``LlamaForCausalLM``), Qwen2 (``Qwen2ForCausalLM``: qkv bias) and Qwen3
(``Qwen3ForCausalLM``: RMSNorm on each query/key head). All three are pre-norm decoders with
RMSNorm, SwiGLU MLPs, grouped-query attention and RoPE (``rope_type`` "default"); embeddings may be
tied to the output layer. Anything else (MoE, sliding windows, RoPE scaling, biases on the output
projection or MLP) raises ``UnsupportedArchitecture`` naming the field, rather than building a
model that silently differs from the HF one.

Example: Qwen2-0.5B -> ``ModelArch(family="qwen2", num_layers=24, hidden_size=896,
num_attention_heads=14, num_query_groups=2, head_dim=64, ffn_hidden_size=4864,
vocab_size=151936, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, qkv_bias=True,
qk_norm=False)``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Literal, Mapping

__all__ = ["ModelArch", "UnsupportedArchitecture", "SUPPORTED_MODEL_TYPES", "load_hf_config"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


class UnsupportedArchitecture(ValueError):
    """The HF config describes a model the megatron backend does not build (named in the message)."""


@dataclasses.dataclass(frozen=True)
class ModelArch:
    """Shape and options of one dense decoder, enough to build it and to convert its weights.

    Attributes:
        family: HF ``model_type``: "llama", "qwen2" or "qwen3".
        num_layers / hidden_size / ffn_hidden_size: layer count, model width, SwiGLU width.
        num_attention_heads / num_query_groups: query heads and key/value heads (GQA groups).
        head_dim: channels per head (``kv_channels``; Qwen3 may differ from hidden / heads).
        vocab_size: rows of the HF embedding (the megatron one is padded, ``padded_vocab_size``).
        rope_theta: RoPE base. rms_norm_eps: epsilon of every RMSNorm.
        tie_word_embeddings: the output layer reuses the input embedding.
        qkv_bias: q/k/v projections carry a bias (Qwen2). qk_norm: RMSNorm on q and k heads (Qwen3).
        max_position_embeddings: from the config; bounds nothing here, kept for the megatron model.
    """

    family: Literal["llama", "qwen2", "qwen3"]
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
            f"num_key_value_heads={self.num_query_groups}" if self.num_query_groups % tp and tp % self.num_query_groups else "",
        ]
        problems = [p for p in problems if p]
        if problems:
            raise ValueError(f"--tensor-model-parallel-size={tp} must divide {', '.join(problems)} of this {self.family} model")

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "ModelArch":
        """Read a ``config.json`` dict (or ``PretrainedConfig.to_dict()``).

        Raises:
            UnsupportedArchitecture: another ``model_type``, or an option this backend does not build.
        """
        model_type = config.get("model_type")
        arch_names = config.get("architectures") or [model_type]
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedArchitecture(
                f"the megatron backend builds {', '.join(SUPPORTED_MODEL_TYPES)} dense decoders; this checkpoint is "
                f"model_type={model_type!r} (architectures={arch_names})"
            )
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        rope = _rope_theta(config, model_type)
        unsupported = {
            "hidden_act": (config.get("hidden_act", "silu"), "silu"),
            "mlp_bias": (bool(config.get("mlp_bias") or False), False),
            "use_sliding_window": (bool(config.get("use_sliding_window") or False), False),
            "num_experts": (config.get("num_experts") or config.get("num_local_experts") or 0, 0),
        }
        if model_type in ("llama", "qwen3"):  # their attention_bias also puts a bias on o_proj
            unsupported["attention_bias"] = (bool(config.get("attention_bias") or False), False)
        for field, (value, want) in unsupported.items():
            if value != want:
                raise UnsupportedArchitecture(f"{model_type} ({arch_names}) with {field}={value!r} is not supported: expected {want!r}")
        return cls(
            family=model_type,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            ffn_hidden_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_query_groups=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab_size=int(config["vocab_size"]),
            rope_theta=rope,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            max_position_embeddings=int(config.get("max_position_embeddings") or 4096),
        )


def _rope_theta(config: Mapping[str, Any], model_type: str) -> float:
    """RoPE base from ``rope_parameters`` (transformers 5) or ``rope_theta`` / ``rope_scaling`` (4.x)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise UnsupportedArchitecture(f"{model_type} with rope_type={rope_type!r} is not supported: expected 'default' RoPE")
    theta = params.get("rope_theta", config.get("rope_theta"))
    return float(theta if theta is not None else 10000.0)


def load_hf_config(model_dir: str) -> dict[str, Any]:
    """The ``config.json`` of an HF model directory, as a dict."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no config.json; expected an HF model directory")
    with open(path) as f:
        return json.load(f)
