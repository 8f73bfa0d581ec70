"""The per-step trainer/engine logprob gap with and without ``--use-rollout-routing-replay``, on the CPU.

A tiny random DeepSeek-V3 (MLA, 8 sigmoid-routed experts in 4 groups, top-4, expert bias, a shared expert, the first
layer dense) is trained by the megatron backend (its own step code; the CPU stand-in of the tests, with torch's AdamW
for megatron's CUDA optimizer) on samples from the embedded engine (transformers' ``DeepseekV3ForCausalLM``). The
engine holds the weights rounded to bf16, as SGLang serves them: its router picks other experts at near-ties and
its dense parts round differently, the two sources of the gap on a GPU. After every step the trainer's weights go to
the engine through disk (rounded again). Run from the repository root:

    .venv/bin/python scripts/routing_replay_gap.py [--steps 4] [--json OUT.json]

Prints, per step, ``train/train_rollout_logprob_abs_diff`` and ``_max`` for a run without and a run with replay
(each from the same start, same seeds). Replay removes the routing part of the gap; the bf16 rounding of every
other weight stays. About a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "train" / "megatron")]  # the CPU trainer stand-in and the tiny config

PROMPTS = [[0, 5, 9, 17, 3], [4, 8, 15, 16], [23, 42, 7], [11, 13, 17, 19, 21, 2]]
PARAMS = {"temperature": 1.0, "ignore_eos": True}


def _round_to_bf16(hf_dir: str) -> None:
    """Every floating tensor of ``hf_dir``'s safetensors rounded to bf16 (kept fp32 on disk), in place."""
    for path in Path(hf_dir).glob("*.safetensors"):
        weights = {
            k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v for k, v in load_file(path).items()
        }
        save_file(weights, path, metadata={"format": "pt"})


async def _rollout(pool, step: int, version: int, replay: bool):
    from slime.rollout.generate import generate
    from slime.types import Group, Sample

    groups = []
    for gi in range(4):
        samples = []
        for i in range(4):
            s = Sample(prompt_ids=PROMPTS[(gi + i) % 4], index=i, group_id=100 * step + gi)
            await generate(s, PARAMS, pool=pool, max_response_len=16, engine_version=version)
            s.reward = float((sum(s.response_ids) + i) % 2)
            samples.append(s)
        groups.append(Group(group_id=100 * step + gi, samples=samples))
    assert all((s.routed_experts is not None) == replay for g in groups for s in g.samples)
    return groups


async def _run(model_dir: str, ctx, *, replay: bool, steps: int, work: str) -> list[dict]:
    from conftest import _cpu_megatron_trainer
    from test_deepseek_v3 import CPU_MOE

    from slime.config import RolloutConfig, TrainConfig
    from slime.engines.pool import HttpEnginePool
    from slime.servers.embedded import EngineServer

    torch.manual_seed(0)
    config = TrainConfig(lr=2e-2, global_batch_size=16, micro_batch_size=8, megatron=CPU_MOE)
    trainer = _cpu_megatron_trainer(config, model_dir, ctx, rollout_temperature=1.0)
    engine_dir = os.path.join(work, f"engine_{replay}_v0")
    trainer.save_hf(engine_dir)
    _round_to_bf16(engine_dir)
    rollout = RolloutConfig(
        request_timeout_s=120, max_retries=1, retry_backoff_s=0.01, use_rollout_routing_replay=replay
    )
    out = []
    async with EngineServer(engine_dir, port=0, seed=0, weight_version="0") as server:
        async with HttpEnginePool([server.url], config=rollout) as pool:
            for step in range(steps):
                metrics = trainer.train_step(await _rollout(pool, step, step, replay)).to_dict()
                out.append(
                    {k: metrics[k] for k in ("train_rollout_logprob_abs_diff", "train_rollout_logprob_abs_diff_max")}
                )
                path = os.path.join(work, f"engine_{replay}_v{step + 1}")
                trainer.save_hf(path)
                _round_to_bf16(path)
                await pool.update_weights_from_disk(path, weight_version=str(step + 1))
    return out


def _megatron_on_the_cpu():
    """megatron's parallel state on one gloo rank, with ``torch.cuda``'s two calls it makes whatever the device
    answered on the CPU (as ``tests/train/megatron/conftest.py``'s ``megatron_cpu`` does for the tests)."""
    from slime.config import MegatronConfig
    from slime.train.megatron.parallel import init_parallel

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return init_parallel(MegatronConfig(), seed=0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--json", help="also write the numbers here")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    from test_deepseek_v3 import _make_hf

    ctx = _megatron_on_the_cpu()
    results = {}
    with tempfile.TemporaryDirectory(prefix="routing_replay_gap_") as work:
        model = _make_hf("yarn")
        model.generation_config.eos_token_id = 1
        model.save_pretrained(os.path.join(work, "start"))
        for replay in (False, True):
            results["replay" if replay else "no_replay"] = asyncio.run(
                _run(os.path.join(work, "start"), ctx, replay=replay, steps=args.steps, work=work)
            )
    ctx.close()
    print("step  gap mean (no replay / replay)      gap max (no replay / replay)")
    for i, (a, b) in enumerate(zip(results["no_replay"], results["replay"])):
        mean, top = "train_rollout_logprob_abs_diff", "train_rollout_logprob_abs_diff_max"
        print(f"{i + 1:>4}  {a[mean]:.3e} / {b[mean]:.3e}            {a[top]:.3e} / {b[top]:.3e}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
