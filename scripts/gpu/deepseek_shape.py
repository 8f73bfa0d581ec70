"""A DeepSeek-V3-shaped model scaled to one GPU: make it, reward it, bench its trainer, summarise its RL run.

    python scripts/gpu/deepseek_shape.py make OUT_DIR [--tiny]     random bf16 weights, word tokenizer, prompts.jsonl
    python scripts/gpu/deepseek_shape.py bench MODEL_DIR --out OUT  RL step: plain transformers vs the megatron backend
    python scripts/gpu/deepseek_shape.py summarize RUN_DIR --out OUT  per-step trainer/engine logprob gap of a run

``reward`` (``--custom-rm-path scripts/gpu/deepseek_shape.py:reward``; glm_shape.sh uses it too): the share of
response tokens with an even id. A random model scores about 0.5 with a spread across the samples of a group, so
GRPO's advantages and the gradient are not zero and the RL steps really change the weights (a reward a random model
never earns, as the first one here, leaves every advantage 0 and measures serving, not training).

The shape (``SHAPE``): DeepSeek-V3's attention and MoE layout at 1/6 of its width: hidden 1024, 12 layers (layer
0 dense), 8 heads with V3's MLA head sizes (q latent 768, kv latent 512, q/k heads 128 + 64 rope channels, v heads
128, YaRN factor 40 over 4,096 positions with mscale = mscale_all_dim = 1), 64 routed experts of width 512 in 8
groups (top-4 groups, top-8 experts, sigmoid scores with expert bias, routed scaling 2.5), 2 shared experts,
vocab 32,000: about 1.28 B parameters, about 0.27 B active per token. ``--tiny`` writes a CPU-sized one
with the same structure (for the CPU smoke test).

FLOPs per token (``flops_per_token``): as ``slime.bench.trainer.flops_per_token`` (forward ``2 N + attention``,
training 3x), with N the matmul parameters a token passes through: MLA's projections, the router, the top-k
routed experts and the shared ones (dense layers: their MLP), the output layer; attention ``s * heads * (d_qk +
d_v)`` per layer (counted in full, the project's convention).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

VOCAB = 32000
SHAPE: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=1024, intermediate_size=4096, moe_intermediate_size=512, num_hidden_layers=12,
    num_attention_heads=8, num_key_value_heads=8, n_routed_experts=64, num_experts_per_tok=8, n_group=8, topk_group=4,
    n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=768,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=163840,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                         beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
    rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=3,
    initializer_range=0.02,
)  # fmt: skip
TINY = dict(
    SHAPE, vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=2, num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=4, n_group=4, topk_group=2,
    q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    max_position_embeddings=4096,
    rope_parameters=dict(SHAPE["rope_parameters"], factor=4.0, original_max_position_embeddings=256),
)  # fmt: skip


def count_params(shape: dict[str, Any]) -> tuple[int, int]:
    """(total, active per token) parameters of ``shape``: embeddings and norms excluded from active, the router in it."""
    h, heads, layers = shape["hidden_size"], shape["num_attention_heads"], shape["num_hidden_layers"]
    dq = shape["qk_nope_head_dim"] + shape["qk_rope_head_dim"]
    q = h * shape["q_lora_rank"] + shape["q_lora_rank"] * heads * dq if shape["q_lora_rank"] else h * heads * dq
    kv = h * (shape["kv_lora_rank"] + shape["qk_rope_head_dim"])
    kv += shape["kv_lora_rank"] * heads * (shape["qk_nope_head_dim"] + shape["v_head_dim"])
    attn = q + kv + heads * shape["v_head_dim"] * h
    dense_mlp = 3 * h * shape["intermediate_size"]
    expert = 3 * h * shape["moe_intermediate_size"]
    experts, k, shared = shape["n_routed_experts"], shape["num_experts_per_tok"], shape["n_shared_experts"]
    dense, moe = shape["first_k_dense_replace"], layers - shape["first_k_dense_replace"]
    router = h * experts
    out = shape["vocab_size"] * h
    total = layers * attn + dense * dense_mlp + moe * (router + (experts + shared) * expert) + 2 * out
    active = layers * attn + dense * dense_mlp + moe * (router + (k + shared) * expert) + out
    return total, active


def flops_per_token(shape: dict[str, Any], seq_len: int) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs per token at ``seq_len`` (module docstring)."""
    _, active = count_params(shape)
    heads, layers = shape["num_attention_heads"], shape["num_hidden_layers"]
    dq = shape["qk_nope_head_dim"] + shape["qk_rope_head_dim"]
    fwd = 2 * active + seq_len * heads * (dq + shape["v_head_dim"]) * layers
    return float(fwd), float(3 * fwd)


async def reward(sample: Any) -> float:
    """Share of ``sample.response_ids`` that are even, in [0, 1] (0.0 for an empty response).

    Any tokenizer (the word-level one here, GLM's), learnable from random weights: raise the even ids' logits."""
    ids = sample.response_ids
    return sum(1 for t in ids if t % 2 == 0) / max(1, len(ids))


def make(out: str, *, tiny: bool = False) -> None:
    """Write the model (bf16, on the GPU when there is one), a word-level tokenizer and 256 prompts into ``out``.

    Idempotent: an ``out`` holding ``.complete`` is kept. ``config.json`` also gets the YaRN block as
    ``rope_scaling`` (the transformers 4.x key older readers look for) beside transformers 5's ``rope_parameters``.
    """
    if os.path.exists(os.path.join(out, ".complete")):
        print(f"{out}: already made")
        return
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerFast

    shape = TINY if tiny else SHAPE
    os.makedirs(out, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {tok: i for i, tok in enumerate(specials)} | {f"t{i}": i for i in range(len(specials), shape["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    fast.save_pretrained(out)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = DeepseekV3ForCausalLM(DeepseekV3Config(**shape)).to(torch.bfloat16)
    model.save_pretrained(out)
    path = os.path.join(out, "config.json")
    config = json.load(open(path))
    config["rope_scaling"] = dict(config["rope_parameters"], type="yarn")
    # keys DeepSeek-V3's own config.json ships and SGLang 0.5.17's deepseek_v2.py reads as attributes
    # (transformers' DeepseekV3Config has no field for them): without moe_layer_freq the server does not start
    config.setdefault("rope_theta", config["rope_parameters"].get("rope_theta", 10000.0))
    config.update(moe_layer_freq=1, scoring_func="sigmoid", topk_method="noaux_tc", ep_size=1)
    config.setdefault("num_nextn_predict_layers", 0)
    json.dump(config, open(path, "w"), indent=2)
    with open(os.path.join(out, "prompts.jsonl"), "w") as f:
        for i in range(256):
            words = " ".join(f"t{4 + (i * 7 + j * 13) % (shape['vocab_size'] - 4)}" for j in range(8))
            f.write(json.dumps({"prompt": words}) + "\n")
    total, active = count_params(shape)
    print(f"{out}: DeepSeek-V3 shape, {total / 1e9:.3f} B parameters ({active / 1e9:.3f} B active per token)")
    open(os.path.join(out, ".complete"), "w").close()


def bench(model_dir: str, out: str, *, num_samples: int, seq_len: int, warmup: int, steps: int, backends: str) -> dict:
    """RL step and MFU of each backend on random groups (``slime.bench.trainer.measure``); writes ``deepseek_bench.json``."""
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpu"))
    from megatron_common import make_groups

    from slime.bench.trainer import TransformersReference, matmul_ceiling_tflops, measure, megatron_backend
    from slime.config import MegatronConfig, TrainConfig

    shape = json.load(open(os.path.join(model_dir, "config.json")))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    prompt = seq_len // 8
    groups = make_groups(
        vocab_size=shape["vocab_size"], num_groups=max(num_samples // 8, 1), group_size=min(num_samples, 8),
        prompt_len=prompt, response_len=seq_len - prompt, ragged=False, seed=0,
    )  # fmt: skip
    n_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for g in groups for s in g.samples)
    fwd, train = (n_tokens * f for f in flops_per_token(shape, seq_len))
    cuda = device.type == "cuda"
    cfg = TrainConfig(
        global_batch_size=num_samples, micro_batch_size=1, lr=1e-6,
        megatron=MegatronConfig(bf16=cuda, use_dynamic_batch_size=True, max_tokens_per_gpu=4 * seq_len),
    )  # fmt: skip
    ceiling = matmul_ceiling_tflops(device)
    total, active = count_params(shape)
    result: dict[str, Any] = dict(
        params_total=total, params_active=active, num_samples=num_samples, seq_len=seq_len, tokens_per_step=n_tokens,
        train_flops_per_step=train, matmul_ceiling_tflops=ceiling, device=torch.cuda.get_device_name() if cuda else "cpu",
        backends={},
    )  # fmt: skip
    for name in backends.split(","):
        if name == "transformers":
            backend: Any = TransformersReference(
                cfg, model_dir=model_dir, device=device, precision="autocast" if cuda else "fp32"
            )
        else:
            from slime.train.megatron.trainer import MegatronTrainer

            backend = megatron_backend(MegatronTrainer(cfg, model_dir=model_dir))
        try:
            r = measure(
                backend, groups, warmup=warmup, steps=steps, fwd_flops=fwd, train_flops=train, ceiling_tflops=ceiling
            )
        finally:
            backend.close()
        r.pop("per_step", None)
        result["backends"][name] = r
        print(
            f"{name}: RL step {r['rl_step_s']:.3f} s, MFU {r['mfu_rl_step']:.3f} (train+opt {r['mfu_train_opt']:.3f})"
        )
        del backend
        if cuda:
            torch.cuda.empty_cache()
    ref, meg = result["backends"].get("transformers"), result["backends"].get("megatron")
    if ref and meg:
        result["speedup_rl_step"] = ref["rl_step_s"] / meg["rl_step_s"]
        print(f"megatron / transformers RL step speed-up: {result['speedup_rl_step']:.2f}x")
    _write(os.path.join(out, "deepseek_bench.json"), result)
    return result


def summarize(run_dir: str, out: str, name: str = "rl") -> dict:
    """Per-step trainer/engine logprob gap, reward, grad norm, step and sync times of an RL run's ``metrics.jsonl``;
    ``deepseek_<name>.json``
    (``rl``; ``replay`` for the run with ``--use-rollout-routing-replay``)."""
    recs = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in recs if r.get("kind") == "step"]
    pick = lambda key: [r.get(key) for r in steps]  # noqa: E731
    result = dict(
        steps=len(steps),
        logprob_abs_diff=pick("train/train_rollout_logprob_abs_diff"),
        logprob_abs_diff_max=pick("train/train_rollout_logprob_abs_diff_max"),
        step_time_s=pick("step_time_s"),
        train_time_s=pick("train_time_s"),
        weight_sync_s=pick("weight_sync_s"),
        reward_mean=pick("reward_mean"),
        grad_norm=pick("train/grad_norm"),  # > 0: the step changed the weights
        advantage_abs_mean=pick("train/advantage_abs_mean"),
    )
    times = [t for t in result["step_time_s"][1:] if isinstance(t, (int, float))]
    result["step_time_s_median"] = statistics.median(times) if times else None
    gaps = " ".join("-" if g is None else f"{g:.2e}" for g in result["logprob_abs_diff"])
    norms = " ".join("-" if g is None else f"{g:.3g}" for g in result["grad_norm"])
    print(f"{len(steps)} steps; logprob |trainer - engine| mean per step: {gaps}; grad norm per step: {norms}")
    _write(os.path.join(out, f"deepseek_{name}.json"), result)
    return result


def _write(path: str, payload: Any) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("--tiny", action="store_true")
    b = sub.add_parser("bench")
    b.add_argument("model_dir")
    b.add_argument("--out", default=os.environ.get("OUT", "/tmp/slime_gpu_out"))
    b.add_argument("--num-samples", type=int, default=8)
    b.add_argument("--seq-len", type=int, default=2048)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--steps", type=int, default=2)
    b.add_argument("--backends", default="transformers,megatron")
    s = sub.add_parser("summarize")
    s.add_argument("run_dir")
    s.add_argument("--out", default=os.environ.get("OUT", "/tmp/slime_gpu_out"))
    s.add_argument("--name", default="rl")
    args = p.parse_args(argv)
    if args.cmd == "make":
        make(args.out, tiny=args.tiny)
    elif args.cmd == "bench":
        bench(
            args.model_dir, args.out, num_samples=args.num_samples, seq_len=args.seq_len, warmup=args.warmup,
            steps=args.steps, backends=args.backends,
        )  # fmt: skip
    else:
        summarize(args.run_dir, args.out, args.name)


if __name__ == "__main__":
    main()
