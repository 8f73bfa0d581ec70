"""One RL step end to end on the CPU with a tiny random GLM-4.7-Flash: the embedded engine serves it through
transformers' own ``Glm4MoeLiteForCausalLM``, the trainer (megatron backend, and the torch backend) trains on the
engine's samples, weight sync carries the new weights (expert bias included) back under HF's names, and the engine's
logprobs then agree with the trainer's again.

Same tiny model as ``test_glm4_moe_lite.py``'s "flash" (q latent, plain RoPE, 4 groups of 2 experts, top-4, routed
scaling 1.8, a shared expert, layer 0 dense, ``rms_norm_eps`` 1e-5 beside the latent norms' 1e-6). The megatron
trainer is ``conftest``'s CPU stand-in (the trainer's own step code; torch's AdamW for megatron's CUDA optimizer).
"""

from __future__ import annotations

import pytest
from safetensors.torch import load_file
from test_deepseek_v3 import CPU_MOE
from test_deepseek_v3_loop import _step_sync_step
from test_glm4_moe_lite import make_glm_lite

from slime.config import TrainConfig


@pytest.fixture(scope="module")
def lite_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("hf_glm_lite_loop")
    make_glm_lite("flash").save_pretrained(path)  # no tokenizer: the test speaks token ids
    return str(path)


def _check(first: dict, second: dict) -> None:
    # step 1 starts from the engine's weights; step 2 from the synced ones: trainer and engine agree on both
    assert first["train_rollout_logprob_abs_diff"] < 1e-4 and second["train_rollout_logprob_abs_diff"] < 1e-4
    assert first["grad_norm"] > 0 and first["num_train_tokens"] == 64.0


async def test_megatron_backend_rl_step_end_to_end(lite_dir, megatron_cpu, cpu_megatron_trainer, tmp_path):
    config = TrainConfig(lr=5e-2, global_batch_size=8, micro_batch_size=4, megatron=CPU_MOE)
    trainer = cpu_megatron_trainer(config, lite_dir, megatron_cpu, rollout_temperature=0.9)
    first, second = await _step_sync_step(trainer, lite_dir, tmp_path)
    _check(first, second)
    assert sum(first[f"moe_expert_load_{e}"] for e in range(8)) == pytest.approx(1.0)
    saved = load_file(next(tmp_path.rglob("*.safetensors")))
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in saved
    assert (
        "model.layers.1.self_attn.kv_a_proj_with_mqa.weight" in saved and "model.layers.0.mlp.gate_proj.weight" in saved
    )


async def test_torch_backend_rl_step_end_to_end(lite_dir, tmp_path):
    from slime.train.torch_backend import TorchTrainer

    trainer = TorchTrainer(
        TrainConfig(lr=5e-2, global_batch_size=8, micro_batch_size=4), model_dir=lite_dir, rollout_temperature=0.9
    )
    first, second = await _step_sync_step(trainer, lite_dir, tmp_path)
    _check(first, second)
