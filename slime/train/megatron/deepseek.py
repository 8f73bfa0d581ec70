"""DeepSeek-V3 / Kimi-K2 (``DeepseekV3ForCausalLM``) from its HF config: multi-latent attention, DeepSeek MoE, names.

Pure config and name code (no megatron import): ``arch.ModelArch.from_hf_config`` reads a
``deepseek_v3`` config through ``deepseek_v3_fields``; ``convert`` maps weights with ``DEEPSEEK_V3_HF_NAMES``;
``slime.train.megatron.mla`` holds the megatron modules. The MoE layers are ``deepseek_moe``'s.
Multi-token-prediction layers (``num_nextn_predict_layers``, stored as layers past
``num_hidden_layers``) are not built: their tensors are never read, and one log line says so.

MLA compresses keys and values into one low-rank latent per token (``kv_lora_rank``) plus one
shared RoPE key of ``qk_rope_head_dim`` channels; queries go through their own low-rank
projection (``q_lora_rank``; absent in DeepSeek-V2-Lite, where ``q_proj`` maps the hidden state
directly). Each head's query and key are ``[nope (qk_nope_head_dim) | rope (qk_rope_head_dim)]``,
its value ``v_head_dim`` wide. Mapping (HF config -> ``MLATransformerConfig``)::

    q_lora_rank -> q_lora_rank (None: linear_q_proj)    kv_lora_rank -> kv_lora_rank
    qk_nope_head_dim -> qk_head_dim                     qk_rope_head_dim -> qk_pos_emb_head_dim
    v_head_dim -> v_head_dim                            rope_theta -> rotary_base
    rope_parameters (rope_type "yarn") -> rope_type "yarn", rotary_scaling_factor = factor,
        original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim
    rope_type "default" -> rope_type "rope" (rotary_scaling_factor 1: softmax scale 1/sqrt(d))

RoPE: megatron's MLA rotates the rope channels itself (``apply_rotary_pos_emb`` per packed
sequence, positions restarting at each one) after de-interleaving them (``x[0::2] | x[1::2]``),
which is HF's ``rope_interleave=True`` (DeepSeek-V3's layout); YaRN frequencies, the cos/sin
concentration factor ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)`` and the
softmax scale ``get_mscale(factor, mscale_all_dim)^2 / sqrt(d_q)`` are HF's formulas. So the core
attention here (``MLACoreAttention``) does no RoPE; it is slime's ``SDPACoreAttention`` on the
rotated heads, with each value head zero-padded from ``v_head_dim`` to the query width so the
fused kernels (which want one head width) run, and the padding cut off their output.

Refused (``UnsupportedArchitecture`` in ``arch``): ``rope_interleave=False``, an explicit YaRN
``attention_factor`` or ``truncate=False`` (megatron computes neither), ``attention_bias``, and value heads
wider than the query/key heads (megatron-core 0.19 pads values to the query width for packed sequences, and
would cut wider ones; no released MLA model has them).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Literal

from slime.train.megatron.deepseek_moe import deepseek_moe_fields

__all__ = [
    "MLAArch",
    "deepseek_v3_fields",
    "mla_param_names",
    "MLA_HF_NAMES",
    "DEEPSEEK_MOE_HF_NAMES",
    "DEEPSEEK_V3_HF_NAMES",
]

log = logging.getLogger(__name__)

MLA_HF_NAMES = {
    "self_attention.linear_q_proj.weight": ("self_attn.q_proj.weight",),
    "self_attention.linear_q_down_proj.weight": ("self_attn.q_a_proj.weight",),
    "self_attention.q_layernorm.weight": ("self_attn.q_a_layernorm.weight",),
    "self_attention.linear_q_up_proj.weight": ("self_attn.q_b_proj.weight",),
    "self_attention.linear_kv_down_proj.weight": ("self_attn.kv_a_proj_with_mqa.weight",),
    "self_attention.kv_layernorm.weight": ("self_attn.kv_a_layernorm.weight",),
    "self_attention.linear_kv_up_proj.weight": ("self_attn.kv_b_proj.weight",),
}
"""megatron's ``MLASelfAttention`` parameters (in a layer) -> HF's. Same row layouts: ``q_b_proj`` rows
are per head ``[nope | rope]``, ``kv_a_proj_with_mqa`` rows ``[latent | rope key]``, ``kv_b_proj`` rows
per head ``[k nope | v]``; each projection is column-parallel (rows split over TP), ``o_proj`` row-parallel."""

DEEPSEEK_MOE_HF_NAMES = {
    "mlp.router.expert_bias": ("mlp.gate.e_score_correction_bias",),
    "mlp.shared_experts.linear_fc1.weight": (
        "mlp.shared_experts.gate_proj.weight",
        "mlp.shared_experts.up_proj.weight",
    ),
    "mlp.shared_experts.linear_fc2.weight": ("mlp.shared_experts.down_proj.weight",),
}
"""The DeepSeek-style MoE names that differ from Qwen2-MoE's (a buffer, plural ``shared_experts``)."""

DEEPSEEK_V3_HF_NAMES = {**MLA_HF_NAMES, **DEEPSEEK_MOE_HF_NAMES}


class _Unsupported(ValueError):
    """An MLA option megatron-core does not compute; ``arch`` re-raises it as UnsupportedArchitecture."""


@dataclasses.dataclass(frozen=True)
class MLAArch:
    """The attention shape of an MLA model (module docstring).

    Attributes:
        q_lora_rank: width of the query latent (0: no query compression, ``q_proj``).
        kv_lora_rank: width of the key/value latent.
        qk_nope_head_dim / qk_rope_head_dim: channels per query/key head without and with RoPE.
        v_head_dim: channels per value head.
        rope_type: "rope" (plain RoPE) or "yarn".
        yarn_factor / original_max_position_embeddings / beta_fast / beta_slow: YaRN's parameters.
        mscale / mscale_all_dim: YaRN's concentration parameters (None / 0.0: HF's defaults).
    """

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_type: Literal["rope", "yarn"] = "rope"
    yarn_factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float = 0.0

    @property
    def q_head_dim(self) -> int:
        """Channels per query/key head: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], model_type: str) -> MLAArch:
        """Read the MLA keys and the RoPE parameters (``rope_parameters``, or 4.x ``rope_scaling``).

        Raises:
            ValueError: an option of the module docstring's refused list, or a rope type other than
                "default" / "yarn".
        """
        if not config.get("rope_interleave", True):
            raise _Unsupported(f"{model_type} with rope_interleave=False: expected True (DeepSeek's layout)")
        if config.get("attention_bias"):
            raise _Unsupported(f"{model_type} with attention_bias=True: expected False")
        shape: dict[str, Any] = dict(
            q_lora_rank=int(config.get("q_lora_rank") or 0),
            kv_lora_rank=int(config["kv_lora_rank"]),
            qk_nope_head_dim=int(config["qk_nope_head_dim"]),
            qk_rope_head_dim=int(config["qk_rope_head_dim"]),
            v_head_dim=int(config["v_head_dim"]),
        )
        if shape["v_head_dim"] > shape["qk_nope_head_dim"] + shape["qk_rope_head_dim"]:  # megatron pads v to q's width
            raise _Unsupported(
                f"{model_type} with v_head_dim={shape['v_head_dim']}: expected at most the q/k head width"
            )
        rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if rope_type == "default":
            return cls(**shape)
        if rope_type != "yarn":
            raise _Unsupported(f"{model_type} with rope_type={rope_type!r}: expected 'default' or 'yarn'")
        for key, ok in (("attention_factor", None), ("truncate", True)):
            if rope.get(key, ok) != ok:
                raise _Unsupported(f"{model_type} with YaRN {key}={rope[key]!r}: expected {ok!r}")
        mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        return cls(
            **shape,
            rope_type="yarn",
            yarn_factor=float(rope["factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            beta_fast=float(rope.get("beta_fast") or 32),
            beta_slow=float(rope.get("beta_slow") or 1),
            # HF uses mscale only next to mscale_all_dim; megatron's None means the same (get_mscale(factor))
            mscale=float(mscale) if mscale and all_dim else None,
            mscale_all_dim=float(all_dim or 0.0),
        )

    def config_fields(self, rope_theta: float) -> dict[str, object]:
        """The ``MLATransformerConfig`` fields (module docstring's mapping); they override the GQA ones."""
        return dict(
            multi_latent_attention=True,
            q_lora_rank=self.q_lora_rank or None,
            kv_lora_rank=self.kv_lora_rank,
            qk_head_dim=self.qk_nope_head_dim,
            qk_pos_emb_head_dim=self.qk_rope_head_dim,
            v_head_dim=self.v_head_dim,
            rope_type=self.rope_type,
            rotary_base=rope_theta,
            rotary_scaling_factor=self.yarn_factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            mscale=self.mscale,
            mscale_all_dim=self.mscale_all_dim,
        )


def deepseek_v3_fields(
    config: Mapping[str, Any], model_type: str = "deepseek_v3", moe_layers: tuple[bool, ...] | None = None
) -> dict[str, Any]:
    """The ``ModelArch`` keyword arguments of a ``deepseek_v3`` config (MLA, DeepSeek MoE, first-k dense).

    ``model_type`` is the family and the name in messages; ``moe_layers`` replaces the layers ``first_k_dense_replace``
    names. Both for GLM-4.7-Flash, whose layers are DeepSeek-V3's and whose layer list is its own (``glm_lite``).

    ``head_dim`` is the query/key head width ``qk_nope_head_dim + qk_rope_head_dim``; every head
    is its own key/value group (``num_query_groups = num_attention_heads``).

    Raises:
        ValueError: an option ``MLAArch.from_hf_config`` or ``deepseek_moe_fields`` refuses.
    """
    if config.get("hidden_act", "silu") != "silu":
        raise _Unsupported(f"{model_type} with hidden_act={config['hidden_act']!r}: expected 'silu'")
    mla = MLAArch.from_hf_config(config, model_type)
    heads = int(config["num_attention_heads"])
    mtp = int(config.get("num_nextn_predict_layers") or 0)
    if mtp:
        log.info(
            "%s: %d multi-token-prediction layer(s) in the checkpoint are not built (their weights are ignored)",
            model_type,
            mtp,
        )
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta"))
    return dict(
        family=model_type,
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=int(config["hidden_size"]),
        ffn_hidden_size=int(config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=heads,
        head_dim=mla.q_head_dim,
        vocab_size=int(config["vocab_size"]),
        rope_theta=float(theta if theta is not None else 10000.0),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=False,
        qk_norm=False,
        max_position_embeddings=int(config.get("max_position_embeddings") or 4096),
        mla=mla,
        **{**deepseek_moe_fields(config, model_type), **({"moe_layers": moe_layers} if moe_layers else {})},
    )


def mla_param_names(mla: MLAArch, prefix: str) -> list[str]:
    """megatron's ``MLASelfAttention`` parameters of one layer (``prefix`` = ``decoder.layers.i.``) before
    ``linear_proj``, in model order: the query path (low-rank or direct), then the key/value path."""
    q = ["linear_q_down_proj", "q_layernorm", "linear_q_up_proj"] if mla.q_lora_rank else ["linear_q_proj"]
    kv = ["linear_kv_down_proj", "kv_layernorm", "linear_kv_up_proj"]
    return [f"{prefix}self_attention.{m}.weight" for m in (*q, *kv)]
