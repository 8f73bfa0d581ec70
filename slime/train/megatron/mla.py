"""megatron-core modules for multi-latent attention (``slime.train.megatron.deepseek`` reads the config).

``MLACoreAttention`` is the core attention of megatron-core's ``MLASelfAttention`` here: slime's
``SDPACoreAttention`` without RoPE (MLA rotated the rope channels itself), each value head zero-padded
to the query width so the fused kernels (one head width) run, the padding cut off their output.
``mla_layer_spec`` swaps it, and ``LatentRMSNorm`` for the q / kv latent norms, into megatron's local MLA spec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.nn.functional as F
from torch import Tensor

from slime.train.megatron._mcore import mcore
from slime.train.megatron.layers import PackedRoPEParams, RMSNorm, SDPACoreAttention

if TYPE_CHECKING:
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.multi_latent_attention import MLASelfAttentionSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_config import TransformerConfig

__all__ = ["MLACoreAttention", "LatentRMSNorm", "LocalMLASelfAttention", "mla_layer_spec", "HF_LATENT_NORM_EPS"]

_MLASelfAttention: Any = mcore("megatron.core.transformer.multi_latent_attention").MLASelfAttention


HF_LATENT_NORM_EPS = 1e-6
"""The epsilon of transformers' ``q_a_layernorm`` / ``kv_a_layernorm`` (DeepSeek-V3, GLM-4.7-Flash): its default, not
``rms_norm_eps``."""


class LatentRMSNorm(RMSNorm):
    """slime's RMSNorm for the q / kv latents, at transformers' ``HF_LATENT_NORM_EPS`` whatever ``eps`` megatron passes.

    megatron-core's MLA builds both latent norms with ``layernorm_epsilon`` (``rms_norm_eps``), as SGLang 0.5.17 does;
    transformers builds them with ``RMSNorm(rank)``'s default 1e-6. They differ where ``rms_norm_eps`` is not 1e-6
    (GLM-4.7-Flash: 1e-5); the trainer follows transformers, whose logits it is tested against.
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = HF_LATENT_NORM_EPS, **_: object):
        super().__init__(config, hidden_size, HF_LATENT_NORM_EPS)


class MLACoreAttention(SDPACoreAttention):
    """``SDPACoreAttention`` for ``MLASelfAttention``: no RoPE (MLA applied it), values padded to the query width.

    Takes the extra ``k_channels`` / ``v_channels`` that megatron's MLA passes to its core attention.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        k_channels: int | None = None,
        v_channels: int | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ):
        super().__init__(
            config, layer_number, attn_mask_type, attention_type, attention_dropout, softmax_scale, cp_comm_type
        )

    def _rotate(self, query: Tensor, key: Tensor, params: PackedRoPEParams) -> tuple[Tensor, Tensor]:
        return query, key  # MLASelfAttention rotated the rope channels already

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> Tensor:
        """query / key [t, n, d_q], value [t, n, d_v] -> [t, n * d_v].

        The narrower side is zero-padded to ``max(d_q, d_v)``: zero value channels give zero outputs
        (cut off), zero query/key channels add nothing to the scores (the softmax scale is MLA's).
        megatron-core 0.19 pads packed values to the query width itself and cuts its output back; the
        padding here is then a no-op (0.16 passes the values as they are).
        """
        t, n, d_q = query.shape
        d_v = value.shape[-1]
        width = max(d_q, d_v)
        query, key, value = (
            F.pad(x, (0, width - x.shape[-1])) if x.shape[-1] < width else x for x in (query, key, value)
        )
        out = super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params)
        return out.view(t, n, width)[..., :d_v].reshape(t, n * d_v)


class LocalMLASelfAttention(_MLASelfAttention):
    """megatron-core's ``MLASelfAttention`` building exactly the modules its spec names.

    megatron-core 0.19 resolves the q / kv norms through ``QKNormConfigResolver``, which without a q latent
    (``q_lora_rank`` None) demands a fused norm + linear ``linear_q_proj`` (Transformer Engine's) for the kv
    latent norm to be allowed, and without ``qk_layernorm`` refuses the norms altogether; HF's MLA has
    plain norms on both latents and no norm before ``q_proj``. The spec here names every module
    (``mla_layer_spec``), so they are used as they are. (0.16 builds from the spec directly and never calls
    this method.)
    """

    def _resolve_qk_norm_config(self, submodules: MLASelfAttentionSubmodules) -> dict[str, object]:
        return dict(
            linear_q_proj=submodules.linear_q_proj,
            linear_q_up_proj=submodules.linear_q_up_proj,
            linear_kv_up_proj=submodules.linear_kv_up_proj,
            q_layernorm=submodules.q_layernorm,
            kv_layernorm=submodules.kv_layernorm,
        )


def mla_layer_spec(*, num_experts: int | None = None) -> ModuleSpec:
    """megatron-core's local GPT layer spec with ``MLASelfAttention`` (``model.layer_spec``'s MLA twin).

    ``LocalMLASelfAttention`` for the attention, slime's ``RMSNorm`` for the layer norms, ``LatentRMSNorm`` for the
    q / kv latent norms, ``MLACoreAttention`` for the core attention; with ``num_experts`` the MLP is
    megatron's ``MoELayer``.
    """
    spec = mcore("megatron.core.models.gpt.gpt_layer_specs").get_gpt_layer_local_spec(
        num_experts=num_experts,
        moe_grouped_gemm=False,
        normalization="RMSNorm",
        qk_layernorm=True,
        multi_latent_attention=True,
    )
    _trust_megatrons_te_check()
    sub = spec.submodules
    sub.input_layernorm = RMSNorm
    sub.pre_mlp_layernorm = RMSNorm
    sub.self_attention.module = LocalMLASelfAttention
    attn = sub.self_attention.submodules
    attn.core_attention = MLACoreAttention
    attn.q_layernorm = LatentRMSNorm  # built only with a q latent
    attn.kv_layernorm = LatentRMSNorm
    return spec


def _trust_megatrons_te_check() -> None:
    """Make megatron-core's MLA module see what its Transformer Engine module knows: whether TE is installed.

    Without TE, ``megatron.core.extensions.transformer_engine`` still imports (its TE classes are
    ``MagicMock`` stand-ins, its own ``HAVE_TE`` False), so ``multi_latent_attention``'s guarded import
    succeeds and sets that module's ``HAVE_TE`` True; ``MultiLatentAttention.__init__`` then calls
    ``isinstance(linear_proj, TELinear)`` on a mock and raises TypeError (megatron-core 0.16.1).
    """
    te_module = mcore("megatron.core.extensions.transformer_engine")
    if not te_module.HAVE_TE:
        mla_module: Any = mcore("megatron.core.transformer.multi_latent_attention")
        mla_module.HAVE_TE = False
