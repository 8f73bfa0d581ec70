"""Mixture-of-experts models on the CPU through the whole loop: engine decoding, logprob parity, train step, weight sync.

Tiny Qwen3-MoE (renormalised top-2 of 4 experts) and Qwen2-MoE (shared expert with a sigmoid gate,
one dense layer) in HF's on-disk layout, loaded by transformers 5 into fused expert tensors.
"""

from __future__ import annotations

import pytest
import torch

from slime.config import RolloutConfig, SyncConfig, TrainConfig
from slime.engines.pool import HttpEnginePool
from slime.servers.embedded import EngineServer
from slime.servers.embedded.model import load_model
from slime.servers.embedded.runner import ModelRunner
from slime.sync import build_weight_sync
from slime.train.logprobs import sample_logprobs
from slime.types import Group, Sample, Status
from tests.fixtures.tiny_model import TINY_VOCAB_SIZE, write_tiny_moe
from tests.servers.embedded.helpers import StepGate, make_request, max_abs_diff, reference_logprobs

torch.set_num_threads(1)

FAMILIES = ["qwen3_moe", "qwen2_moe"]
PROMPT = [0, 5, 9, 17, 3]


@pytest.fixture(scope="module", params=FAMILIES)
def moe_dir(request, tmp_path_factory):
    return write_tiny_moe(tmp_path_factory.mktemp("moe") / request.param, request.param, seed=0)


def test_checkpoint_views_name_the_fused_experts_as_the_checkpoint_does(moe_dir):
    from safetensors.torch import load_file

    from slime.sync.hf_layout import checkpoint_views

    model = load_model(moe_dir).model
    disk = load_file(moe_dir / "model.safetensors")
    views = checkpoint_views(model.state_dict())
    assert sorted(views) == sorted(disk)
    assert all(torch.equal(views[k], v) for k, v in disk.items())
    name = "model.layers.0.mlp.experts.3.up_proj.weight"
    views[name].fill_(0.25)  # a view: writing it writes the fused parameter
    assert bool((model.model.layers[0].mlp.experts.gate_up_proj[3, 16:] == 0.25).all())


def test_batched_kv_decoding_with_midway_joins_matches_each_alone_and_a_full_forward(moe_dir):
    loaded = load_model(moe_dir)
    prompts, max_new = [[3, 4, 5], [7, 8, 9, 10, 11, 12], [20], [30, 31, 32, 33]], [10, 6, 12, 8]
    runners = [ModelRunner(loaded) for _ in range(2)]
    for r in runners:
        r.start()
    try:
        alone = []
        for i, p in enumerate(prompts):
            req = make_request(f"a{i}", p, max_new_tokens=max_new[i], temperature=1.0)
            runners[0].submit([req])
            alone.append(req.done.result(timeout=30))
        gate = StepGate(lambda r: any(len(q.output_ids) >= 3 for q in r._running))
        runners[1].step_hook = gate
        reqs = [make_request(f"a{i}", p, max_new_tokens=max_new[i], temperature=1.0) for i, p in enumerate(prompts)]
        runners[1].submit(reqs[:2])
        assert gate.reached.wait(30)
        runners[1].submit(reqs[2:])  # join a batch whose KV cache is 3 steps in
        gate.release()
        for req, ref in zip(reqs, alone):
            req.done.result(timeout=30)
            assert req.output_ids == ref.output_ids and len(req.output_ids) == max_new[reqs.index(req)]
            assert max_abs_diff(req.output_logprobs, ref.output_logprobs) <= 1e-5
            assert (
                max_abs_diff(req.output_logprobs, reference_logprobs(loaded.model, req.prompt_ids, req.output_ids, 1.0))
                <= 1e-5
            )
    finally:
        for r in runners:
            r.stop()


def _groups(vocab: int) -> list[Group]:
    g = torch.Generator().manual_seed(3)
    groups = []
    for gi in range(2):
        samples = []
        for i in range(4):
            s = Sample(
                prompt_ids=torch.randint(1, vocab, (4,), generator=g).tolist(),
                index=i,
                group_id=gi,
                reward=float(i % 2),
                status=Status.COMPLETED,
            )
            s.append(
                torch.randint(1, vocab, (5 + i,), generator=g).tolist(),
                (-torch.rand(5 + i, generator=g)).tolist(),
                policy_version=0,
            )
            samples.append(s)
        groups.append(Group(group_id=gi, samples=samples))
    return groups


@pytest.mark.parametrize("method", ["disk", "tensor", "delta"])
async def test_engine_and_trainer_logprobs_agree_before_and_after_a_train_step_and_sync(moe_dir, method, tmp_path):
    """Trainer (torch backend, HF MoE) and engine logprobs agree on the start weights; after one
    train step and a weight sync (per-expert checkpoint names into the engine's fused experts) they
    agree again, and the engine's outputs have moved."""
    from slime.train.torch_backend import TorchTrainer

    trainer = TorchTrainer(TrainConfig(lr=5e-2, global_batch_size=8, micro_batch_size=4), model_dir=str(moe_dir))
    params = {"max_new_tokens": 24, "temperature": 0.9, "ignore_eos": True}
    async with EngineServer(moe_dir, port=0, seed=0, weight_version="0") as server:
        async with HttpEnginePool(
            [server.url], config=RolloutConfig(request_timeout_s=30, max_retries=1, retry_backoff_s=0.01)
        ) as pool:
            before = await pool.generate(PROMPT, params, rid="b-")
            ours = sample_logprobs(trainer.model, PROMPT, before.output_ids, 0.9)
            assert max_abs_diff(ours, before.output_logprobs) <= 1e-4
            sync = build_weight_sync(
                SyncConfig(method=method, update_weight_buffer_size=4096),
                pool=pool,
                trainer=trainer,
                weights_dir=str(tmp_path / "w"),
            )
            metrics = trainer.train_step(_groups(TINY_VOCAB_SIZE)).to_dict()
            assert metrics["grad_norm"] > 0
            await sync.load(await sync.save(1), 1)
            replay = await pool.generate(PROMPT, {**params, "max_new_tokens": 1}, rid="r-")
            after = await pool.generate(PROMPT, params, rid="a-")
            await sync.close()
    assert replay.weight_version == "1"
    new = sample_logprobs(trainer.model, PROMPT, after.output_ids, 0.9)
    assert max_abs_diff(new, after.output_logprobs) <= 1e-4
    stale = sample_logprobs(trainer.model, PROMPT, before.output_ids, 0.9)
    assert max_abs_diff(stale, before.output_logprobs) > 1e-3  # the step changed the weights the engine now holds


async def test_main_job_trains_a_moe_model_end_to_end(tmp_path):
    """The whole loop on a tiny Qwen3-MoE: embedded engine subprocess, APRIL, torch trainer, disk sync of per-expert tensors."""
    import json

    from slime.config import Config, DataConfig, EngineConfig, LoopConfig
    from slime.loop.driver import run_training
    from tests.e2e.test_main_job import count_w7

    model = write_tiny_moe(tmp_path / "model", "qwen3_moe", seed=0, with_tokenizer=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(32)) + "\n")
    config = Config(
        data=DataConfig(prompt_data=str(prompts), eval_prompt_data=str(prompts), num_eval_prompts=4),
        rollout=RolloutConfig(n_samples_per_prompt=4, rollout_max_response_len=16, request_timeout_s=60),
        loop=LoopConfig(mode="april", rollout_batch_size=2, over_sampling_batch_size=4, num_rollout=2, max_staleness=2),
        train=TrainConfig(lr=1e-3, global_batch_size=8, micro_batch_size=4),
        engine=EngineConfig(hf_checkpoint=str(model), startup_timeout_s=60),
        run_dir=str(tmp_path / "run"),
    )
    summary = await run_training(config, reward_fn=count_w7, progress=False)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "step"]
    assert [r["policy_version"] for r in steps] == [1, 2] and summary["final_policy_version"] == 2
    assert all(
        r["train/train_rollout_logprob_abs_diff"] < 1e-3 for r in steps[:1]
    )  # engine and trainer agree on step 1's tokens
    for r in steps:  # router metrics of the torch backend, per step, in metrics.jsonl
        loads = [r[f"train/moe_expert_load_{e}"] for e in range(4)]
        assert (
            abs(sum(loads) - 1.0) < 1e-6
            and r["train/moe_load_imbalance"] >= 1.0
            and r["train/moe_dropped_token_frac"] == 0.0
        )
        assert r["train/moe_load_balancing_loss"] > 0 and r["train/moe_routed_tokens"] > 0


def test_torch_backend_router_metrics_count_real_tokens_and_match_hf_routing(moe_dir):
    """The torch backend's moe_* metrics: routed tokens exclude padding, loads are the HF router's own top-k choices."""
    from slime.train.torch_backend import TorchTrainer

    trainer = TorchTrainer(TrainConfig(lr=1e-3, global_batch_size=8, micro_batch_size=4), model_dir=str(moe_dir))
    groups = _groups(TINY_VOCAB_SIZE)
    seqs = [s.prompt_ids + s.response_ids for g in groups for s in g.samples]
    routers = trainer.router_stats.routers
    E = trainer.model.config.num_experts
    counts = torch.zeros(len(routers), E)  # [L, E]
    with torch.no_grad():  # the reference: the same routers on each sequence alone, no padding
        for seq in seqs:
            picked = []
            handles = [r.register_forward_hook(lambda m, a, out: picked.append(out[2])) for r in routers]  # noqa: B023  # hooks removed within this iteration
            trainer.model(torch.tensor([seq]))
            for h in handles:
                h.remove()
            for layer, idx in enumerate(picked):  # routers fire in layer order
                counts[layer] += torch.bincount(idx.reshape(-1), minlength=E).float()
    metrics = trainer.train_step(groups).to_dict()
    assert metrics["moe_routed_tokens"] == float(sum(len(s) for s in seqs))  # per layer, padding left out
    load = counts / counts.sum(1, keepdim=True)  # [L, E]
    got = torch.tensor([metrics[f"moe_expert_load_{e}"] for e in range(E)])
    torch.testing.assert_close(got, load.mean(0).to(got.dtype), atol=1e-9, rtol=0)
    assert metrics["moe_load_imbalance"] == pytest.approx(float((load.max(1).values * E).mean()))
