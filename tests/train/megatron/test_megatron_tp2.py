"""TP=2 under torchrun with gloo on the CPU: sharded forward, vocab-parallel logprobs and the weight gather."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_tp2_forward_logprobs_and_weight_gather_match_hf(family, hf_dirs, tmp_path):
    pytest.importorskip("megatron.core")
    out = tmp_path / "result.json"
    worker = Path(__file__).with_name("tp2_worker.py")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(worker),
        hf_dirs[family],
        family,
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["logits_max_abs_diff"] < 5e-5
    assert result["logprob_max_abs_diff"] < 5e-5
    assert result["weights_bit_exact"]
