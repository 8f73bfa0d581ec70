"""Fixtures for the megatron-core backend on CPU: tiny HF checkpoints and a CPU megatron set-up.

``megatron_cpu`` is the one place that bends torch for tests. megatron-core 0.16.1 builds a GPT
on the CPU with the local layer spec and a gloo group, but in a few places calls CUDA whatever
the device: ``torch.cuda.current_device()`` for buffer placement (parallel state's global
memory buffer, rotary and softmax helpers, the distributed-checkpoint writer's failure flag) and
``torch.cuda.synchronize()`` after the checkpoint writer stages tensors. A CPU-only torch raises
on both. The fixture makes ``current_device`` answer "cpu" and ``synchronize`` do nothing, for
the duration of one test module, then restores both. Product code never patches torch; it only
passes ``use_cpu_initialization`` on a machine without CUDA.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

TINY = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    initializer_range=0.2,
)
ARCH_CONFIGS = {
    "llama": dict(TINY, rope_theta=5000.0, tie_word_embeddings=False),
    "qwen2": dict(TINY, rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5),
    "qwen3": dict(TINY, rope_theta=1000000.0, tie_word_embeddings=False, head_dim=12),
}
MOE = dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
ARCH_CONFIGS.update(
    qwen3_moe=dict(TINY, **MOE, rope_theta=1000000.0, tie_word_embeddings=False, head_dim=12, norm_topk_prob=True),
    qwen2_moe=dict(
        TINY,
        **MOE,
        num_hidden_layers=3,
        mlp_only_layers=[1],
        shared_expert_intermediate_size=24,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        norm_topk_prob=False,
    ),
)
ARCH_CONFIGS.update(
    glm4=dict(TINY, head_dim=12, rope_parameters=dict(rope_theta=10000.0, partial_rotary_factor=0.5, rope_type="default"),
              pad_token_id=0, eos_token_id=1, tie_word_embeddings=False),
    glm4_moe=dict(TINY, head_dim=12, num_hidden_layers=3, first_k_dense_replace=1, moe_intermediate_size=16,
                  n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=1, n_shared_experts=1,
                  routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
                  rope_parameters=dict(rope_theta=10000.0, partial_rotary_factor=0.5, rope_type="default"),
                  pad_token_id=0, eos_token_id=1, tie_word_embeddings=False),
)  # fmt: skip
"""Tiny configs per family: untied Llama; tied Qwen2 (qkv bias); Qwen3 with head_dim != hidden / heads;
Qwen3-MoE (4 experts, top-2, renormalised top-k); Qwen2-MoE (shared expert with its sigmoid gate,
layer 1 dense, top-k not renormalised, tied embeddings); GLM-4 (q/k/v bias, RoPE on 6 of 12 head
channels interleaved, post-attention and post-MLP norms, fused gate_up_proj on disk); GLM-4.5 (RoPE on 6 of
12 channels, q/k/v bias, q/k norms, layer 0 dense, 8 experts in 4 groups with top-1 group and top-2 experts,
sigmoid scores + a random expert bias, routed scaling 2.5, one shared expert)."""


def make_hf_model(family: str, seed: int = 0):
    """A random tiny HF model of ``family`` (fp32, eval mode); biases and norms randomised too."""
    import transformers as tf

    cfg_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM), "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM), "qwen2_moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM),
        "glm4": (tf.Glm4Config, tf.Glm4ForCausalLM), "glm4_moe": (tf.Glm4MoeConfig, tf.Glm4MoeForCausalLM),
    }[family]  # fmt: skip
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**ARCH_CONFIGS[family]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-style expert bias: zeros in a fresh model
                b.copy_(0.1 * torch.randn_like(b))
    return model.eval()


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One saved tiny HF directory per family, with a stand-in tokenizer_config.json."""
    out = {}
    for family in ARCH_CONFIGS:
        path = tmp_path_factory.mktemp(f"hf_{family}")
        make_hf_model(family).save_pretrained(path)
        (Path(path) / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
        out[family] = str(path)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def megatron_cpu() -> Iterator[object]:
    """A single-process gloo group with megatron's parallel state at TP=1, CUDA calls redirected (module docstring)."""
    pytest.importorskip("megatron.core")
    from slime.config import MegatronConfig
    from slime.train.megatron.parallel import init_parallel

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "current_device", lambda: "cpu")
        mp.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        port = _free_port()
        for var, value in dict(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        ).items():
            mp.setenv(var, value)
        ctx = init_parallel(MegatronConfig(), seed=0)
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture(scope="session")
def make_hf():
    """``make_hf_model`` for tests (test modules here are not a package, so they take it as a fixture)."""
    return make_hf_model


class _PassThroughDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        return contextlib.nullcontext()

    def zero_grad_buffer(self):
        self.module.zero_grad(set_to_none=True)


class _ConstantLR:
    def __init__(self, lr: float):
        self.lr = lr

    def get_lr(self, _group):
        return self.lr


def _cpu_megatron_trainer(
    config, model_dir: str, ctx, *, rollout_temperature: float = 1.0, max_staleness: int | None = None
):
    from slime.train.megatron.arch import ModelArch, load_hf_config
    from slime.train.megatron.model import (
        HFCheckpointReader,
        build_gpt_model,
        load_hf_weights,
        output_hidden_states,
        transformer_config,
    )
    from slime.train.megatron.parallel import ControlChannel
    from slime.train.megatron.router_metrics import attach_megatron_routers
    from slime.train.megatron.step import MegatronTrainStep
    from slime.train.megatron.trainer import MegatronTrainer

    class CpuStep(MegatronTrainStep):
        def _optimizer_step(self) -> float:
            norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_grad))
            if math.isfinite(norm):
                self.optimizer.step()
            return norm

    class CpuMegatronTrainer(MegatronTrainer):
        def __init__(self):  # MegatronTrainer.__init__ minus CUDA, megatron DDP and optimizer
            self.config, self.model_dir, self.policy_version = config, model_dir, 0
            self.rollout_temperature, self.max_staleness = rollout_temperature, max_staleness
            self._lock = threading.Lock()
            self.arch = ModelArch.from_hf_config(load_hf_config(model_dir))
            self.tconfig = transformer_config(self.arch, config.megatron, use_cpu_initialization=True)
            self.ctx, self.channel = ctx, ControlChannel(ctx)
            self.pad_token_id, self.pad_to = 0, 1
            self.model = build_gpt_model(self.arch, self.tconfig, tp_size=1)
            load_hf_weights(self.model, HFCheckpointReader(model_dir), self.arch, tp_size=1, tp_rank=0)
            if config.megatron.logprob_impl == "liger":
                output_hidden_states(self.model)
            self.ddp, self.ref_model = _PassThroughDDP(self.model), None
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=config.lr,
                betas=(config.adam_beta1, config.adam_beta2),
                weight_decay=config.weight_decay,
            )
            self.scheduler = _ConstantLR(config.lr)
            a = self.arch
            self.router_stats = (
                attach_megatron_routers(
                    self.model, num_experts=a.num_experts, topk=a.moe_router_topk, device=torch.device("cpu")
                )
                if a.is_moe
                else None
            )
            self.step = self._new_step(CpuStep)

    return CpuMegatronTrainer()


@pytest.fixture(scope="session")
def cpu_megatron_trainer():
    """``(config, model_dir, ctx, *, rollout_temperature, max_staleness) -> MegatronTrainer`` on the CPU: the trainer's own step code with a pass-through
    DDP and torch's AdamW in place of megatron's (both allocate on CUDA). Needs ``megatron_cpu``'s ctx."""
    return _cpu_megatron_trainer
