"""``--use-rollout-routing-replay`` end to end on the CPU: the embedded engine (transformers' ``DeepseekV3ForCausalLM``)
returns the experts of every token, the rollout keeps them on the Sample, and the megatron trainer's logprob and train
passes take them.

The engine serves the trainer's weights with another ``e_score_correction_bias``: in DeepSeek-V3's router the bias
only chooses the experts (the weights are the unbiased sigmoid scores gathered at them), so the engine picks other
experts than the trainer would, with the same weights at any given expert. Replaying the engine's routes then makes
the trainer's logprobs the engine's up to float noise; ignoring them, or replaying them one token off, does not.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_deepseek_v3 import _make_hf

from slime.config import MegatronConfig, RolloutConfig, TrainConfig
from slime.engines.pool import HttpEnginePool
from slime.rollout.generate import generate
from slime.routed_experts import encode_rows, route_rows
from slime.servers.embedded import EngineServer
from slime.types import Group, Sample, Status

PROMPTS = [[0, 5, 9, 17, 3], [4, 8, 15, 16], [23, 42, 7], [11, 13, 17, 19, 21, 2]]
PARAMS = {"temperature": 0.9, "ignore_eos": True}
REPLAY = RolloutConfig(request_timeout_s=60, max_retries=1, retry_backoff_s=0.01, use_rollout_routing_replay=True)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(the trainer's HF dir, the engine's: the same weights, each MoE layer's expert bias redrawn 10x larger)."""
    trainer_dir, engine_dir = tmp_path_factory.mktemp("rr_trainer"), tmp_path_factory.mktemp("rr_engine")
    model = _make_hf("yarn")
    model.generation_config.eos_token_id = 1
    model.save_pretrained(trainer_dir)
    model.save_pretrained(engine_dir)
    weights_file = next(engine_dir.glob("*.safetensors"))
    weights = load_file(weights_file)
    torch.manual_seed(1)
    for name in weights:
        if name.endswith("e_score_correction_bias"):
            weights[name] = torch.randn_like(weights[name])
    save_file(weights, weights_file, metadata={"format": "pt"})
    return str(trainer_dir), str(engine_dir)


async def _rollout(engine_dir: str) -> list[Group]:
    """Two groups of 4 samples through the rollout's own ``generate`` (so ``Sample.routed_experts`` is filled)."""
    groups = []
    async with EngineServer(engine_dir, port=0, seed=0, weight_version="0") as server:
        async with HttpEnginePool([server.url], config=REPLAY) as pool:
            for gi in range(2):
                samples = []
                for i in range(4):
                    s = Sample(prompt_ids=PROMPTS[(2 * gi + i) % 4], index=i, group_id=gi)
                    await generate(s, PARAMS, pool=pool, max_response_len=8, engine_version=0)
                    s.reward = float(i % 2)
                    samples.append(s)
                groups.append(Group(group_id=gi, samples=samples))
    return groups


def _shifted(groups: list[Group], shift: int | None) -> list[Group]:
    """Copies of ``groups`` without routes (``shift`` None) or with each sample's rows moved ``shift`` tokens later."""
    out = copy.deepcopy(groups)
    for s in (s for g in out for s in g.samples):
        if shift is None:
            s.routed_experts = None
            continue
        rows = route_rows(s.routed_experts or "", len(s.prompt_ids) + len(s.response_ids) - 1)
        s.routed_experts = encode_rows(np.roll(rows, shift, axis=0))
    return out


async def test_replay_makes_the_trainer_take_the_engines_experts(dirs, megatron_cpu, cpu_megatron_trainer):
    trainer_dir, engine_dir = dirs
    groups = await _rollout(engine_dir)
    s = groups[0].samples[0]
    assert s.status is Status.TRUNCATED and len(s.response_ids) == 8
    assert route_rows(s.routed_experts or "", len(s.prompt_ids) + 7).shape == (len(s.prompt_ids) + 7, 3 * 4)
    # the bias that only selects: a tiny lr and a frozen bias keep the three steps on the same weights
    megatron = MegatronConfig(moe_token_dispatcher_type="allgather", moe_router_bias_update_rate=0.0)
    config = TrainConfig(lr=1e-12, global_batch_size=8, micro_batch_size=4, megatron=megatron)
    trainer = cpu_megatron_trainer(config, trainer_dir, megatron_cpu, rollout_temperature=0.9)
    replayed = trainer.train_step(groups).to_dict()
    ignored = trainer.train_step(_shifted(groups, None)).to_dict()
    off_by_one = trainer.train_step(_shifted(groups, 1)).to_dict()
    print(
        {k: (m["train_rollout_logprob_abs_diff"], m["train_rollout_logprob_abs_diff_max"], m["approx_kl"])
         for k, m in (("replayed", replayed), ("ignored", ignored), ("off_by_one", off_by_one))}
    )  # fmt: skip
    assert replayed["train_rollout_logprob_abs_diff_max"] < 1e-4  # float noise: the engine's experts
    assert ignored["train_rollout_logprob_abs_diff"] > 1e-2  # the trainer's own experts differ from the engine's
    assert off_by_one["train_rollout_logprob_abs_diff"] > 1e-2
    # the train pass replays as the old-logprob pass does: the new logprobs equal the old ones at step 1
    assert replayed["approx_kl"] < 1e-8 and replayed["grad_norm"] > 0


async def test_the_embedded_engine_answers_the_experts_transformers_routes_each_fed_token_to(dirs):
    import transformers as tf

    _, engine_dir = dirs
    prompt = PROMPTS[0]
    async with EngineServer(engine_dir, port=0, seed=0, weight_version="0") as server:
        async with HttpEnginePool([server.url], config=REPLAY) as pool:
            out = await pool.generate(prompt, dict(PARAMS, max_new_tokens=6), rid="one-")
    rows = route_rows(out.routed_experts or "", len(prompt) + 5).reshape(-1, 3, 4)  # [T, layers, top-k]
    model = tf.AutoModelForCausalLM.from_pretrained(engine_dir, dtype=torch.float32).eval()
    seen: dict[int, torch.Tensor] = {}
    for i in (1, 2):  # the MoE layers; layer 0 is dense
        model.model.layers[i].mlp.gate.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, o[-1]))
    with torch.no_grad():
        model(torch.tensor([prompt + out.output_ids[:-1]]))  # one forward over every token the engine was fed
    assert (rows[:, 0] == 0).all()
    for i in (1, 2):
        assert np.array_equal(np.sort(rows[:, i], axis=-1), np.sort(seen[i].numpy(), axis=-1))


async def test_a_dense_model_has_no_routes_and_the_client_names_the_server_flag(make_hf, tmp_path):
    from slime.errors import ProtocolError

    make_hf("llama").save_pretrained(tmp_path)  # no tokenizer: the test speaks token ids
    async with EngineServer(str(tmp_path), port=0, seed=0, weight_version="0") as server:
        async with HttpEnginePool([server.url], config=REPLAY) as pool:
            with pytest.raises(ProtocolError, match="--enable-return-routed-experts"):
                await pool.generate([1, 2, 3], dict(PARAMS, max_new_tokens=2), rid="dense-")
