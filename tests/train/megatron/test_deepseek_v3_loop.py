"""One RL step end to end on the CPU with a tiny random DeepSeek-V3: the embedded engine serves it through transformers'
own ``DeepseekV3ForCausalLM``, the trainer (megatron backend, and the torch backend) trains on the engine's samples,
weight sync carries the new weights (expert bias included) back, and the engine's logprobs then agree with the trainer's.

Same tiny model as ``test_deepseek_v3.py`` (MLA with a q latent and YaRN, sigmoid router with bias over 4 groups of 2,
routed scaling, a shared expert, the first layer dense). The megatron trainer is the CPU stand-in of ``conftest``
(the trainer's own step code; torch's AdamW for megatron's CUDA optimizer).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_deepseek_v3 import CPU_MOE, _make_hf

from slime.config import RolloutConfig, SyncConfig, TrainConfig
from slime.engines.pool import HttpEnginePool
from slime.servers.embedded import EngineServer
from slime.sync import build_weight_sync
from slime.types import Group, Sample, Status

PROMPTS = [[0, 5, 9, 17, 3], [4, 8, 15, 16], [23, 42, 7], [11, 13, 17, 19, 21, 2]]
PARAMS = {"max_new_tokens": 8, "temperature": 0.9, "ignore_eos": True}


@pytest.fixture(scope="module")
def ds_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("hf_deepseek_loop")
    model = _make_hf("yarn")
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)  # no tokenizer: the test speaks token ids
    return str(path)


async def _rollout(pool: HttpEnginePool, version: int, tag: str) -> list[Group]:
    """Two groups of 4 samples from the engine (prompt i of group g: PROMPTS[(2 g + i) % 4]), rewards 0/1."""
    groups = []
    for gi in range(2):
        samples = []
        for i in range(4):
            prompt = PROMPTS[(2 * gi + i) % len(PROMPTS)]
            out = await pool.generate(prompt, PARAMS, rid=f"{tag}{gi}-{i}-")
            s = Sample(prompt_ids=prompt, index=i, group_id=gi, reward=float(i % 2), status=Status.COMPLETED)
            s.append(out.output_ids, out.output_logprobs, policy_version=version)
            samples.append(s)
        groups.append(Group(group_id=gi, samples=samples))
    return groups


async def _step_sync_step(trainer, ds_dir: str, tmp_path: Path) -> tuple[dict, dict]:
    """Rollout -> train step -> disk sync -> rollout -> train step; the two steps' metrics."""
    async with EngineServer(ds_dir, port=0, seed=0, weight_version="0") as server:
        config = RolloutConfig(request_timeout_s=60, max_retries=1, retry_backoff_s=0.01)
        async with HttpEnginePool([server.url], config=config) as pool:
            sync = build_weight_sync(SyncConfig(method="disk"), pool=pool, trainer=trainer, weights_dir=str(tmp_path))
            first = trainer.train_step(await _rollout(pool, 0, "a")).to_dict()
            await sync.load(await sync.save(1), 1)
            second = trainer.train_step(await _rollout(pool, 1, "b")).to_dict()
            await sync.close()
    return first, second


def _check(first: dict, second: dict) -> None:
    # step 1 starts from the engine's weights; step 2 from the synced ones: trainer and engine agree on both
    assert first["train_rollout_logprob_abs_diff"] < 1e-4 and second["train_rollout_logprob_abs_diff"] < 1e-4
    assert first["grad_norm"] > 0 and first["num_train_tokens"] == 64.0


async def test_megatron_backend_rl_step_end_to_end(ds_dir, megatron_cpu, cpu_megatron_trainer, tmp_path):
    config = TrainConfig(lr=5e-2, global_batch_size=8, micro_batch_size=4, megatron=CPU_MOE)
    trainer = cpu_megatron_trainer(config, ds_dir, megatron_cpu, rollout_temperature=0.9)
    first, second = await _step_sync_step(trainer, ds_dir, tmp_path)
    _check(first, second)
    assert sum(first[f"moe_expert_load_{e}"] for e in range(8)) == pytest.approx(1.0)
    saved = load_file(next(tmp_path.rglob("*.safetensors")))
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in saved
    assert "model.layers.1.self_attn.kv_b_proj.weight" in saved


async def test_torch_backend_rl_step_end_to_end(ds_dir, tmp_path):
    from slime.train.torch_backend import TorchTrainer

    trainer = TorchTrainer(
        TrainConfig(lr=5e-2, global_batch_size=8, micro_batch_size=4), model_dir=ds_dir, rollout_temperature=0.9
    )
    first, second = await _step_sync_step(trainer, ds_dir, tmp_path)
    _check(first, second)
