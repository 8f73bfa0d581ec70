"""THUDM/slime launch-script flags that have no config field here, and what each does instead.

A slime script (``scripts/models/<model>.sh`` + ``scripts/run-<model>.sh``) passes Megatron-LM flags
that this slime derives elsewhere or does not need. ``COMPAT_FLAGS`` gives each one of two fates,
never silence:

- ``Checked``: an architecture flag, compared with the ``config.json`` of ``--hf-checkpoint`` (the
  model is built from that file here). A mismatch is a ``ConfigError`` naming the flag, both
  values and the HF key::

      --num-layers 40 disagrees with /m/config.json: num_hidden_layers = 36

- ``NoOp``: accepted, and one INFO line says why it changes nothing here. ``allowed`` lists the
  values for which that is true (``--hidden-dropout 0.0``); any other value is an error.

Flags that are applied live in ``slime.cli.args.FLAGS``; ``docs/slime_flags.md`` tables all three.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slime.cli.compat_facts import MISSING as _MISSING
from slime.cli.compat_facts import UNUSED as _UNUSED
from slime.cli.compat_facts import Checked, Fact, HFConfig, NoOp
from slime.cli.compat_facts import key as _key
from slime.cli.compat_moe import MOE_MLA_FLAGS
from slime.errors import ConfigError
from slime.hf_config_defaults import with_transformers_defaults

__all__ = ["COMPAT_FLAGS", "Checked", "NoOp", "add_compat_flags", "check_compat_flags"]

log = logging.getLogger(__name__)


def _rope_theta(hf: HFConfig) -> Fact:
    if "rope_theta" in hf:
        return "rope_theta", hf["rope_theta"], float(hf["rope_theta"])
    params = hf.get("rope_parameters") or {}
    if "rope_theta" in params:
        return "rope_parameters.rope_theta", params["rope_theta"], float(params["rope_theta"])
    return "rope_theta", "absent", _MISSING


def _partial_rotary(hf: HFConfig) -> Fact:
    """``partial_rotary_factor`` where the model build reads it (``arch._rotary_dim``): in ``rope_parameters``
    with transformers 5, top level before; 1.0 (full rotary) when neither has it."""
    params = hf.get("rope_parameters") or {}
    if params.get("partial_rotary_factor") is not None:
        raw = params["partial_rotary_factor"]
        return "rope_parameters.partial_rotary_factor", raw, float(raw)
    raw = hf.get("partial_rotary_factor")
    return "partial_rotary_factor", "absent" if raw is None else raw, 1.0 if raw is None else float(raw)


def _rope_scaling_factor(hf: HFConfig) -> Fact:
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if "factor" in scaling:
        return "rope_scaling.factor", scaling["factor"], float(scaling["factor"])
    return "rope_scaling.factor", "absent", _MISSING


def _uses_rope(hf: HFConfig) -> Fact:
    key, raw, theta = _rope_theta(hf)
    return key, raw, True if theta is not _MISSING else _MISSING


def _normalization(hf: HFConfig) -> Fact:
    for k, norm in (("rms_norm_eps", "RMSNorm"), ("layer_norm_eps", "LayerNorm"), ("layer_norm_epsilon", "LayerNorm")):
        if k in hf:
            return k, hf[k], norm
    return "rms_norm_eps", "absent", _MISSING


def _head_dim(hf: HFConfig) -> Fact:
    if hf.get("kv_lora_rank"):  # multi-latent attention: head widths are --qk-head-dim / --v-head-dim
        return "kv_lora_rank", hf["kv_lora_rank"], _UNUSED
    if hf.get("head_dim"):
        return "head_dim", hf["head_dim"], int(hf["head_dim"])
    if "hidden_size" in hf and "num_attention_heads" in hf:
        dim = hf["hidden_size"] // hf["num_attention_heads"]
        return "hidden_size / num_attention_heads", dim, dim
    return "head_dim", "absent", _MISSING


def _gqa(hf: HFConfig) -> Fact:
    if "num_key_value_heads" not in hf or "num_attention_heads" not in hf:
        return "num_key_value_heads", "absent", _MISSING
    kv, heads = hf["num_key_value_heads"], hf["num_attention_heads"]
    return "num_key_value_heads / num_attention_heads", f"{kv} / {heads}", kv < heads


# HF model types whose attention normalises q and k (HF configs have no key for it)
_QK_NORM_TYPES = frozenset(
    {
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
        "qwen3_vl",
        "qwen3_vl_moe",
        "olmo2",
        "olmoe",
        "gemma3",
        "gemma3_text",
        "gemma4",
        "gemma4_text",
        "glm4_moe",
        "chameleon",
    }
)
# ... and those with a bias on q, k and v only (Megatron's --add-qkv-bias)
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"})


# GLM-4-0414 (HF "glm4") adds a norm after attention and after the MLP; GLM models rotate interleaved pairs
_POST_NORM_TYPES = frozenset({"glm4"})
_INTERLEAVED_ROPE_TYPES = frozenset({"glm", "glm4", "chatglm"})


def _model_type_in(types: frozenset[str]) -> Callable[[HFConfig], Fact]:
    """A fact that only ``model_type`` says (HF configs have no key for it)."""

    def get(hf: HFConfig) -> Fact:
        if "model_type" not in hf:
            return "model_type", "absent", _MISSING
        return "model_type", hf["model_type"], hf["model_type"] in types

    return get


def _qk_norm(hf: HFConfig) -> Fact:
    if hf.get("kv_lora_rank"):  # multi-latent attention: --qk-layernorm is the norm of its q / kv latents
        return "kv_lora_rank", hf["kv_lora_rank"], True
    for k in ("use_qk_norm", "qk_layernorm"):
        if k in hf:
            return k, hf[k], bool(hf[k])
    model_type = hf.get("model_type", "absent")
    return "model_type", model_type, True if model_type in _QK_NORM_TYPES else _MISSING


def _qkv_bias(hf: HFConfig) -> Fact:
    if hf.get("kv_lora_rank") and not hf.get("attention_bias"):  # megatron's MLA has no q/k/v bias to add
        return "attention_bias", hf.get("attention_bias", "absent"), _UNUSED
    if hf.get("model_type") in _QKV_BIAS_TYPES:
        return "model_type", hf["model_type"], True
    return "attention_bias", hf.get("attention_bias", "absent"), bool(hf.get("attention_bias", False))


_FLAG = dict(action="store_true")
_INT = dict(type=int)
_FLOAT = dict(type=float)
_ZERO_DROPOUT = "dropout is off here (the model trains in eval mode, so old and new logprobs of the first step match); only 0 is accepted"

COMPAT_FLAGS: dict[str, Checked | NoOp] = {
    # Megatron architecture (scripts/models/*.sh): the model is built from --hf-checkpoint's config.json.
    "--num-layers": Checked(_key("num_hidden_layers", "num_layers"), _INT),
    "--hidden-size": Checked(_key("hidden_size"), _INT),
    "--ffn-hidden-size": Checked(_key("intermediate_size"), _INT),
    "--num-attention-heads": Checked(_key("num_attention_heads"), _INT),
    "--group-query-attention": Checked(_gqa, _FLAG),
    "--num-query-groups": Checked(_key("num_key_value_heads"), _INT),
    "--kv-channels": Checked(_head_dim, _INT),
    "--swiglu": Checked(_key("hidden_act", "hidden_activation", convert=lambda act: act in ("silu", "swish")), _FLAG),
    "--rotary-base": Checked(_rope_theta, _FLOAT),
    "--use-rotary-position-embeddings": Checked(_uses_rope, _FLAG),
    "--position-embedding-type": Checked(
        lambda hf: (*_uses_rope(hf)[:2], "rope" if _uses_rope(hf)[2] is True else _MISSING),
        dict(choices=["rope", "learned_absolute", "none"]),
    ),
    "--rotary-percent": Checked(_partial_rotary, _FLOAT),
    "--normalization": Checked(_normalization, dict(choices=["RMSNorm", "LayerNorm"])),
    "--norm-epsilon": Checked(_key("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", convert=float), _FLOAT),
    "--qk-layernorm": Checked(_qk_norm, _FLAG),
    "--vocab-size": Checked(_key("vocab_size"), _INT),
    "--untie-embeddings-and-output-weights": Checked(
        _key("tie_word_embeddings", default=True, convert=lambda tied: not tied), _FLAG
    ),
    "--disable-bias-linear": Checked(_key("mlp_bias", default=True, convert=lambda bias: not bias), _FLAG),
    "--add-qkv-bias": Checked(_qkv_bias, _FLAG),
    "--max-position-embeddings": Checked(_key("max_position_embeddings"), _INT),
    "--num-experts": Checked(_key("num_experts", "num_local_experts", "n_routed_experts"), _INT),
    "--moe-router-topk": Checked(_key("num_experts_per_tok"), _INT),
    "--moe-ffn-hidden-size": Checked(_key("moe_intermediate_size"), _INT),
    "--use-rope-scaling": Checked(_key("rope_scaling", default=False, convert=bool), _FLAG),
    "--rotary-scaling-factor": Checked(_rope_scaling_factor, _FLOAT),
    # GLM-4 (scripts/models/glm4-9B.sh): layer options the HF model_type implies; the torch backend builds them from it
    "--post-self-attn-layernorm": Checked(_model_type_in(_POST_NORM_TYPES), _FLAG),
    "--post-mlp-layernorm": Checked(_model_type_in(_POST_NORM_TYPES), _FLAG),
    "--rotary-interleaved": Checked(_model_type_in(_INTERLEAVED_ROPE_TYPES), _FLAG),
    "--spec": NoOp(
        "the layer spec follows the HF config's model_type (slime/train/megatron/arch.py)",
        dict(nargs=2, metavar=("MODULE", "FUNCTION")),
    ),
    "--moe-router-dtype": NoOp(
        "the router gate runs in fp32 (slime/train/megatron/layers.py)", dict(), allowed=("fp32",)
    ),
    "--moe-token-drop-policy": NoOp(
        "the megatron backend's policy; tokens are dropped only with --moe-expert-capacity-factor",
        dict(),
        allowed=("probs",),
    ),
    "--moe-grouped-gemm": NoOp(
        "a kernel choice of megatron-core; experts run as its local (sequential) MLPs here", _FLAG
    ),
    "--moe-permute-fusion": NoOp("a Transformer Engine kernel; token permutation runs unfused here", _FLAG),
    "--no-rope-fusion": NoOp(
        "RoPE is applied by slime's attention (a torch.compile kernel on CUDA), not megatron's fused RoPE", _FLAG
    ),
    # Megatron numerics and kernels
    "--attention-dropout": NoOp(_ZERO_DROPOUT, _FLOAT, allowed=(0.0,)),
    "--hidden-dropout": NoOp(_ZERO_DROPOUT, _FLOAT, allowed=(0.0,)),
    "--attention-softmax-in-fp32": NoOp(
        "attention is SDPA / flash attention in both backends, whose kernels keep the softmax in fp32", _FLAG
    ),
    "--accumulate-allreduce-grads-in-fp32": NoOp(
        "gradients are fp32 already (torch backend: fp32 params; megatron backend: grad_reduce_in_fp32 is always on)",
        _FLAG,
    ),
    "--attention-backend": NoOp(
        "both backends run their own attention: SDPA (torch); packed micro-batches as a dense padded SDPA batch or varlen flash attention, by length spread (megatron, slime/train/megatron/layers.py)",
        dict(choices=["flash", "fused", "unfused", "local", "auto"]),
    ),
    "--init-method-std": NoOp("weights are loaded from --hf-checkpoint, never initialised", _FLOAT),
    "--seq-length": NoOp(
        "sequence lengths come from the data (prompt + --rollout-max-response-len); micro-batches are packed by --max-tokens-per-gpu",
        _INT,
    ),
    # Optimizer and data balance
    "--optimizer": NoOp(
        "the optimizer is always AdamW (Megatron's 'adam' is AdamW: decoupled --weight-decay)",
        dict(),
        allowed=("adam",),
    ),
    "--balance-data": NoOp(
        "always on: each step's samples are split over data-parallel ranks by token count, longest first onto the lightest rank (slime/train/megatron/packing.py)",
        _FLAG,
    ),
    "--optimizer-cpu-offload": NoOp("optimizer state stays on the GPU (memory only: the update is the same)", _FLAG),
    "--overlap-cpu-optimizer-d2h-h2d": NoOp(
        "optimizer state stays on the GPU, so there is no host copy to overlap", _FLAG
    ),
    "--use-precision-aware-optimizer": NoOp(
        "AdamW keeps fp32 master weights and moments (memory only, at fp32 precision)", _FLAG
    ),
    "--disable-compute-advantages-and-returns": NoOp(
        "SFT (--loss-type sft_loss) computes no advantages here anyway", _FLAG
    ),
    "--use-slime-router": NoOp(
        "requests are spread by slime's own engine pool, or by sglang-router for launched SGLang servers; slime's router middleware does not exist here",
        _FLAG,
    ),
    # Logging
    "--wandb-key": NoOp(
        "wandb reads WANDB_API_KEY from the environment (a key on the command line shows in ps)", dict()
    ),
    "--wandb-run-id": NoOp("W&B names the run itself; the run directory (--save) is in its config", dict()),
    **MOE_MLA_FLAGS,  # routing, MoE layout and multi-latent attention (slime.cli.compat_moe)
}
"""Every accepted THUDM/slime flag that is not in ``slime.cli.args.FLAGS``, with its fate."""


def add_compat_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``COMPAT_FLAGS`` to ``parser`` (default None: a flag not given is not checked or logged)."""
    group = parser.add_argument_group(
        "THUDM/slime flags checked against --hf-checkpoint or no-ops here (docs/slime_flags.md)"
    )
    for flag, entry in COMPAT_FLAGS.items():
        help_text = (
            "checked against --hf-checkpoint's config.json" if isinstance(entry, Checked) else f"no-op: {entry.reason}"
        )
        kwargs = dict(entry.kwargs)
        if kwargs.get("action") != "store_true" and "choices" not in kwargs:
            kwargs.setdefault("metavar", flag[2:].upper().replace("-", "_"))
        group.add_argument(flag, dest=_dest(flag), default=None, help=help_text.replace("%", "%%"), **kwargs)


def _dest(flag: str) -> str:
    return "compat_" + flag[2:].replace("-", "_")


def check_compat_flags(ns: argparse.Namespace, hf_checkpoint: str | None) -> None:
    """Check each given ``COMPAT_FLAGS`` flag: ``Checked`` ones against ``hf_checkpoint/config.json``
    (its ``text_config`` overrides the top level, for vision-language models), ``NoOp`` ones against
    ``allowed``, then logged in one line each.

    A ``config.json`` that is missing (e.g. ``--dry-run`` with a path of another machine) or a key
    the HF config does not have is logged as not checked; the preflight of a real run refuses a
    missing ``config.json`` anyway.

    Raises:
        ConfigError: an architecture flag that disagrees with the HF config (both values and the HF
            key), a no-op flag with a value it is not a no-op for, or an unreadable ``config.json``.
    """
    given = {flag: getattr(ns, _dest(flag), None) for flag in COMPAT_FLAGS}
    given = {flag: value for flag, value in given.items() if value is not None and value is not False}
    checked = [flag for flag in given if isinstance(COMPAT_FLAGS[flag], Checked)]
    hf = _hf_config(hf_checkpoint, checked) if checked else None
    path = Path(hf_checkpoint or "") / "config.json"
    for flag, value in given.items():
        entry = COMPAT_FLAGS[flag]
        shown = "" if value is True else f" {_num(value)}"
        if isinstance(entry, NoOp):
            if entry.allowed is not None and value not in entry.allowed:
                raise ConfigError(
                    f"{flag}{shown}: not supported here, only {' / '.join(map(_num, entry.allowed))} ({entry.reason})"
                )
            log.info("%s%s: no-op here: %s", flag, shown, entry.reason)
        elif hf is None:
            log.warning("%s%s: not checked: %s not found", flag, shown, path)
        else:
            try:
                key, raw, expected = entry.hf_value(hf)
            except (TypeError, ValueError, AttributeError) as exc:  # a config.json value of the wrong type
                raise ConfigError(f"{path}: cannot check {flag}: {type(exc).__name__}: {exc}") from None
            if expected is _MISSING:
                log.warning("%s%s: not checked: %s has no %s", flag, shown, path, key)
            elif expected is _UNUSED:
                log.info("%s%s: checked: not used by this model (%s = %s in %s)", flag, shown, key, raw, path)
            elif not _same(value, expected):
                raise ConfigError(f"{flag}{shown} disagrees with {path}: {key} = {raw}{_implies(flag, expected)}")
            else:
                log.info("%s%s: checked: matches %s of %s", flag, shown, key, path)


def _hf_config(hf_checkpoint: str | None, flags: list[str]) -> HFConfig | None:
    path = Path(hf_checkpoint or "") / "config.json"
    if not hf_checkpoint or not path.is_file():
        return None
    try:
        hf = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it to check {', '.join(flags)}: {exc}") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(hf).__name__}")
    text = hf.get("text_config")
    # the keys it leaves out as the model build fills them (transformers' defaults for its model_type)
    return {**hf, **text} if isinstance(text, dict) else with_transformers_defaults(hf)


def _same(value: Any, expected: Any) -> bool:
    if isinstance(value, float) or isinstance(expected, float):
        return isinstance(expected, (int, float)) and math.isclose(float(value), float(expected), rel_tol=1e-9)
    return value == expected


def _num(value: object) -> str:
    """A value as a script writes it: ``10000``, not ``10000.0``."""
    if isinstance(value, list):
        return " ".join(map(_num, value))
    return f"{value:.15g}" if isinstance(value, float) else str(value)


def _implies(flag: str, expected: object) -> str:
    """What the HF value means in the flag's terms, where it is not the same number."""
    if isinstance(expected, bool):
        return f" (so {flag} does not apply)" if not expected else ""
    return "" if isinstance(expected, (int, float)) else f" ({expected})"
