"""``slime.cli.compat`` entries for the MoE routing, MoE layout and multi-latent attention flags of slime's model scripts.

THUDM/slime's ``scripts/models/deepseek-v3.sh``, ``kimi-k2.sh``, ``glm4.5-355B-A32B.sh`` and ``glm4.7-30B-A3B.sh``
spell DeepSeek-style routing, the dense/MoE layer pattern and MLA's shapes in Megatron flags; here each is
compared with the HF ``config.json`` it must agree with (the model is built from that file)::

    --moe-router-score-function sigmoid    scoring_func, else model_type (DeepSeek-V3, Kimi-K2, GLM-4.5 to 4.7)
    --moe-router-enable-expert-bias        topk_method "noaux_tc", or a GLM-4.5-style model_type
    --moe-router-pre-softmax               softmax routers: not norm_topk_prob; sigmoid ones: not used
    --moe-router-topk-scaling-factor 2.5   routed_scaling_factor
    --moe-router-num-groups / -group-topk  n_group / topk_group
    --moe-shared-expert-intermediate-size  n_shared_experts * moe_intermediate_size (shared_expert_intermediate_size)
    --moe-layer-freq [0]*3+[1]*89          first_k_dense_replace, moe_layer_freq (decoder_sparse_step, mlp_only_layers)
    --multi-latent-attention               kv_lora_rank present
    --q-lora-rank / --kv-lora-rank         q_lora_rank / kv_lora_rank
    --qk-head-dim / --qk-pos-emb-head-dim  qk_nope_head_dim / qk_rope_head_dim
    --v-head-dim                           v_head_dim
    --mscale / --mscale-all-dim            rope_scaling.mscale / mscale_all_dim (YaRN)

``--moe-layer-freq`` takes Megatron's three spellings: an int N (every N-th layer, from 0), a Python-like list
(``[0,0,0,1,1]``) or a product-and-sum of lists (``[0]*3+[1]*89``, ``([1]*48)``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from slime.cli.compat_facts import MISSING, UNUSED, Checked, Fact, HFConfig, NoOp, key

__all__ = ["MOE_MLA_FLAGS", "LayerPattern"]

_SIGMOID_TYPES = frozenset({"deepseek_v3", "kimi_k2", "glm4_moe", "glm4_moe_lite"})
_EXPERT_BIAS_TYPES = frozenset({"glm4_moe", "glm4_moe_lite"})  # their HF router always has e_score_correction_bias
_FLAG = dict(action="store_true")
_INT = dict(type=int)
_FLOAT = dict(type=float)


class LayerPattern:
    """Which layers are MoE layers (1) or dense (0), as ``--moe-layer-freq`` writes it or as an HF config implies.

    Equal to another pattern when both give the same list for the same number of layers (an int N resolves
    against the other side's length). ``str`` is the flag's text, or a run-length form (``[0]*3+[1]*89``).
    """

    def __init__(self, text: str, layers: tuple[int, ...] | None = None, every: int | None = None):
        self.text, self.layers, self.every = text, layers, every

    @classmethod
    def parse(cls, text: str) -> LayerPattern:
        """``--moe-layer-freq``'s value. Raises ValueError (argparse names the flag) for anything else."""
        text = text.strip()
        if text.isdigit():
            return cls(text, every=int(text))
        layers = _evaluate(ast.parse(text, mode="eval").body)
        if not isinstance(layers, list) or any(x not in (0, 1) for x in layers):
            raise ValueError(f"expected an int or a list of 0/1, got {text!r}")
        return cls(text, layers=tuple(layers))

    @classmethod
    def of(cls, layers: tuple[int, ...]) -> LayerPattern:
        runs: list[tuple[int, int]] = []
        for x in layers:
            runs = runs[:-1] + [(x, runs[-1][1] + 1)] if runs and runs[-1][0] == x else runs + [(x, 1)]
        return cls("+".join(f"[{x}]*{n}" for x, n in runs), layers=layers)

    def resolve(self, num_layers: int) -> tuple[int, ...]:
        if self.layers is not None:
            return self.layers
        return tuple(int(i % (self.every or 1) == 0) for i in range(num_layers))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LayerPattern):
            return NotImplemented
        n = len(other.layers if other.layers is not None else self.layers or ())
        return self.resolve(n) == other.resolve(n)

    def __hash__(self) -> int:
        return hash(self.layers)

    def __str__(self) -> str:
        return self.text


def _evaluate(node: ast.expr) -> list[int] | int:
    """A list / int expression of ``+`` and ``*`` only (no names, no calls): ``[0]*3+[1]*89``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.List):
        return [_int(_evaluate(e)) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _evaluate(node.left), _evaluate(node.right)
        return left + right if isinstance(node.op, ast.Add) else left * right  # type: ignore[operator]  # list * int, list + list
    raise ValueError(f"not a layer pattern: {ast.unparse(node)!r}")


def _int(x: list[int] | int) -> int:
    if not isinstance(x, int):
        raise ValueError("nested lists are not a layer pattern")
    return x


def _moe_layers(hf: HFConfig) -> Fact:
    n = hf.get("num_hidden_layers")
    if not isinstance(n, int):
        return "num_hidden_layers", "absent", MISSING
    if hf.get("mlp_layer_types"):  # GLM-4.7-Flash as transformers builds it, first_k_dense_replace ignored (glm_lite)
        pattern = LayerPattern.of(tuple(int(t == "sparse") for t in hf["mlp_layer_types"]))
        return "mlp_layer_types", str(pattern).replace("[0]", "['dense']").replace("[1]", "['sparse']"), pattern
    if "first_k_dense_replace" in hf or "n_routed_experts" in hf:  # DeepSeek-V3 / GLM-4.5 layout
        k, freq = int(hf.get("first_k_dense_replace") or 0), int(hf.get("moe_layer_freq") or 1)
        layers = tuple(int(i >= k and i % freq == 0) for i in range(n))
        return "first_k_dense_replace", k, LayerPattern.of(layers)
    if "num_experts" in hf:  # Qwen-MoE layout
        step, dense = int(hf.get("decoder_sparse_step") or 1), set(hf.get("mlp_only_layers") or ())
        layers = tuple(int((i + 1) % step == 0 and i not in dense) for i in range(n))
        return "decoder_sparse_step", step, LayerPattern.of(layers)
    return "num_experts", "absent", MISSING


def _score_function(hf: HFConfig) -> Fact:
    if "scoring_func" in hf:
        return "scoring_func", hf["scoring_func"], hf["scoring_func"]
    model_type = hf.get("model_type", "absent")
    if model_type in _SIGMOID_TYPES:
        return "model_type", model_type, "sigmoid"
    has_experts = any(k in hf for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    return "model_type", model_type, "softmax" if has_experts else MISSING


def _pre_softmax(hf: HFConfig) -> Fact:
    key_, raw, function = _score_function(hf)
    if function == "sigmoid":  # megatron's sigmoid routing never takes a softmax
        return key_, raw, UNUSED
    if "norm_topk_prob" not in hf:
        return "norm_topk_prob", "absent", MISSING
    return "norm_topk_prob", hf["norm_topk_prob"], not hf["norm_topk_prob"]


def _expert_bias(hf: HFConfig) -> Fact:
    if "topk_method" in hf:
        return "topk_method", hf["topk_method"], hf["topk_method"] == "noaux_tc"
    model_type = hf.get("model_type", "absent")
    return "model_type", model_type, True if model_type in _EXPERT_BIAS_TYPES else MISSING


def _shared_width(hf: HFConfig) -> Fact:
    if "shared_expert_intermediate_size" in hf:
        return (
            "shared_expert_intermediate_size",
            hf["shared_expert_intermediate_size"],
            hf["shared_expert_intermediate_size"],
        )
    if "n_shared_experts" in hf and "moe_intermediate_size" in hf:
        n, width = hf["n_shared_experts"] or 0, hf["moe_intermediate_size"]
        return "n_shared_experts * moe_intermediate_size", f"{n} * {width}", int(n) * int(width)
    return "n_shared_experts", "absent", MISSING


def _mla(hf: HFConfig) -> Fact:
    return "kv_lora_rank", hf.get("kv_lora_rank", "absent"), bool(hf.get("kv_lora_rank"))


def _rope_scaling(name: str) -> Callable[[HFConfig], Fact]:
    def get(hf: HFConfig) -> Fact:
        scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
        if name in scaling:
            return f"rope_scaling.{name}", scaling[name], float(scaling[name])
        return f"rope_scaling.{name}", "absent", MISSING

    return get


MOE_MLA_FLAGS: dict[str, Checked | NoOp] = {
    "--moe-layer-freq": Checked(_moe_layers, dict(type=LayerPattern.parse)),
    "--moe-router-score-function": Checked(_score_function, dict(choices=["softmax", "sigmoid"])),
    "--moe-router-pre-softmax": Checked(_pre_softmax, _FLAG),
    "--moe-router-enable-expert-bias": Checked(_expert_bias, _FLAG),
    "--moe-router-topk-scaling-factor": Checked(key("routed_scaling_factor", convert=float), _FLOAT),
    "--moe-router-num-groups": Checked(key("n_group"), _INT),
    "--moe-router-group-topk": Checked(key("topk_group"), _INT),
    "--moe-shared-expert-intermediate-size": Checked(_shared_width, _INT),
    "--multi-latent-attention": Checked(_mla, _FLAG),
    "--q-lora-rank": Checked(key("q_lora_rank"), _INT),
    "--kv-lora-rank": Checked(key("kv_lora_rank"), _INT),
    "--qk-head-dim": Checked(key("qk_nope_head_dim"), _INT),
    "--qk-pos-emb-head-dim": Checked(key("qk_rope_head_dim"), _INT),
    "--v-head-dim": Checked(key("v_head_dim"), _INT),
    "--mscale": Checked(_rope_scaling("mscale"), _FLOAT),
    "--mscale-all-dim": Checked(_rope_scaling("mscale_all_dim"), _FLOAT),
    "--no-position-embedding": NoOp("RoPE runs inside attention; there is no learned position embedding here", _FLAG),
    "--enable-experimental": NoOp("no experimental megatron-core feature is used here", _FLAG),
}
"""The MoE / MLA rows of ``slime.cli.compat.COMPAT_FLAGS`` (module docstring)."""
