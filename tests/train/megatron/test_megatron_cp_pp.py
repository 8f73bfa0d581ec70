"""Context and pipeline parallelism on the CPU (gloo, torchrun): the same step as one rank.

``cp_pp_worker.py`` runs the trainer's step code on a packed batch of six samples of different
lengths (two per micro-batch) once on one rank and once per layout, and compares the per-token
logprobs of the old-logprob pass, the loss (token mean over the whole step), the entropy and the
full gradient of every HF tensor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")


def _run(hf_dir: str, tmp_path: Path, nproc: int, layouts: list[str], **extra_env: str) -> dict:
    out = tmp_path / "result.json"
    worker = Path(__file__).with_name("cp_pp_worker.py")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(extra_env)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(worker),
        hf_dir,
        str(out),
        *layouts,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _check(result: dict) -> None:
    assert result["logprobs_nonzero"]
    assert result["logprob_max_abs_diff"] < 1e-5
    for key in ("loss", "entropy", "ratio_mean"):
        got, want = result[key]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), key
    assert result["grad_names_match"]
    assert result["grad_max_rel_diff"] < 1e-4, result["grad_worst"]


def test_cp2_and_pp2_match_one_rank(hf_dirs, tmp_path):
    """Qwen2 (tied embeddings: the last stage's output layer is the embedding's copy): CP=2, then PP=2."""
    results = _run(hf_dirs["qwen2"], tmp_path, 2, ["1,2,1", "1,1,2"])
    assert sorted(results) == ["1,1,2", "1,2,1"]
    for layout in results.values():
        _check(layout)


@pytest.mark.slow
def test_cp2_tp2_and_pp2_dp2_match_one_rank(hf_dirs, tmp_path):
    """Qwen3 (Q/K norms, head_dim != hidden / heads) on four ranks: CP=2 x TP=2, PP=2 x DP=2, CP=2 x PP=2."""
    results = _run(hf_dirs["qwen3"], tmp_path, 4, ["2,2,1", "1,1,2", "1,2,2"])
    assert sorted(results) == ["1,1,2", "1,2,2", "2,2,1"]
    for layout in results.values():
        _check(layout)


def test_rollout_logprobs_as_old_policy_under_dp2_and_pp2_match_one_rank(hf_dirs, tmp_path):
    """``--use-rollout-logprobs``: every rank already holds the engine's logprobs, so they must not be summed over
    data-parallel ranks (DP=2) or broadcast from the last stage (PP=2); loss, ratio and gradients as on one rank."""
    results = _run(hf_dirs["qwen2"], tmp_path, 2, ["1,1,1", "1,1,2"], SLIME_TEST_USE_ROLLOUT_LOGPROBS="1")
    assert sorted(results) == ["1,1,1", "1,1,2"]
    for layout in results.values():
        _check(layout)
        assert layout["logprob_max_abs_diff"] == 0.0  # the rollout's own numbers, untouched


def test_bf16_pipeline_hands_bf16_logits_to_the_logprobs_and_matches_one_rank(hf_dirs, tmp_path):
    """``--bf16`` (``Float16Module``) under PP=2: the last stage hands its logits over in bf16 (no fp32 copy of
    [tokens, vocabulary]), as one rank does, and the step matches one rank's in bf16."""
    results = _run(hf_dirs["qwen2"], tmp_path, 2, ["1,1,2"], SLIME_TEST_BF16="1")
    got = results["1,1,2"]
    assert got["logit_dtypes"] == [["torch.bfloat16"], ["torch.bfloat16"]]
    assert got["logprobs_nonzero"] and got["grad_names_match"] and got["logprob_max_abs_diff"] < 1e-6
    for key in ("loss", "entropy", "ratio_mean"):
        assert got[key][0] == pytest.approx(got[key][1], rel=1e-6, abs=1e-7), key
    # the tied embedding's two bf16 gradient halves are summed across stages in another order than on one rank:
    # a bf16 rounding step (2^-8) apart at most
    assert got["grad_max_rel_diff"] < 1e-2, got["grad_worst"]
