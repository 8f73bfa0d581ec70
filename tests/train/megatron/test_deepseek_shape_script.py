"""The CPU-testable parts of scripts/gpu/deepseek_shape.{py,sh}: the model it writes, its parameter and FLOPs
counts, the trainer-bench row's reference backend, the run summary, and the shell script's syntax."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gpu" / "deepseek_shape.py"


@pytest.fixture(scope="module")
def shape_mod():
    spec = importlib.util.spec_from_file_location("deepseek_shape", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_dir(shape_mod, tmp_path_factory):
    out = tmp_path_factory.mktemp("ds_shape") / "model"
    shape_mod.make(str(out), tiny=True)
    return out


def test_the_gpu_shape_is_deepseek_v3_scaled_to_one_gpu(shape_mod):
    total, active = shape_mod.count_params(shape_mod.SHAPE)
    s = shape_mod.SHAPE
    assert 1e9 <= total <= 3e9 and active < total / 4
    assert 32 <= s["n_routed_experts"] <= 64 and s["q_lora_rank"] and s["rope_parameters"]["rope_type"] == "yarn"


def test_the_written_model_is_what_the_megatron_backend_reads_and_the_counts_are_hfs(shape_mod, tiny_dir):
    import transformers as tf

    from slime.train.megatron.arch import ModelArch, load_hf_config

    model = tf.AutoModelForCausalLM.from_pretrained(tiny_dir)
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    total, _ = shape_mod.count_params(shape_mod.TINY)
    assert sum(p.numel() for p in model.parameters()) - norms == total
    arch = ModelArch.from_hf_config(load_hf_config(str(tiny_dir)))
    assert arch.mla is not None and arch.mla.rope_type == "yarn" and arch.router is not None
    assert json.loads((tiny_dir / "config.json").read_text())["rope_scaling"]["type"] == "yarn"
    assert len((tiny_dir / "prompts.jsonl").read_text().splitlines()) == 256
    shape_mod.make(str(tiny_dir), tiny=True)  # idempotent: kept


def test_flops_per_token_counts_active_parameters_and_mla_attention(shape_mod):
    s = shape_mod.TINY
    _, active = shape_mod.count_params(s)
    fwd, train = shape_mod.flops_per_token(s, 100)
    attention = 100 * s["num_attention_heads"] * (16 + 8 + 16) * s["num_hidden_layers"]
    assert fwd == 2 * active + attention and train == 3 * fwd


async def test_reward_is_the_share_of_even_token_ids_so_random_groups_have_variance(shape_mod):
    class S:
        def __init__(self, ids):
            self.response_ids = ids

    assert await shape_mod.reward(S([7, 8, 7, 10])) == 0.5 and await shape_mod.reward(S([])) == 0.0
    rng = __import__("random").Random(0)
    group = [await shape_mod.reward(S([rng.randrange(32000) for _ in range(64)])) for _ in range(4)]
    assert len(set(group)) > 1, "a group of random responses must not all score the same (GRPO advantage 0)"


def test_bench_row_of_the_reference_backend_runs_on_the_cpu(shape_mod, tiny_dir, tmp_path):
    result = shape_mod.bench(
        str(tiny_dir), str(tmp_path), num_samples=2, seq_len=32, warmup=0, steps=1, backends="transformers"
    )
    r = json.loads((tmp_path / "deepseek_bench.json").read_text())["backends"]["transformers"]
    assert r["rl_step_s"] > 0 and r["mfu_rl_step"] > 0 and result["tokens_per_step"] == 64


def test_summarize_reads_the_per_step_logprob_gap(shape_mod, tmp_path):
    rows = [{"kind": "eval", "step": 0}] + [
        {"kind": "step", "train/train_rollout_logprob_abs_diff": 0.01 * i, "step_time_s": 2.0 + i} for i in range(3)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = shape_mod.summarize(str(tmp_path), str(tmp_path))
    assert result["logprob_abs_diff"] == [0.0, 0.01, 0.02] and result["step_time_s_median"] == 3.5


def test_summarize_reads_the_keys_a_real_run_writes(shape_mod, tmp_path):
    # the head of a real metrics.jsonl (H200, megatron trainer + SGLang 0.5.17, 2026-12-04): the key names as written
    (tmp_path / "metrics.jsonl").write_text((ROOT / "tests" / "fixtures" / "h200_metrics_head.jsonl").read_text())
    result = shape_mod.summarize(str(tmp_path), str(tmp_path))
    assert result["steps"] == 2 and None not in result["logprob_abs_diff"]
    assert None not in result["reward_mean"] and None not in result["grad_norm"], "a metric name the run does not write"


def test_the_gpu_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu" / "deepseek_shape.sh")]).returncode == 0
