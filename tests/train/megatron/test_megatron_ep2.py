"""Expert parallelism under torchrun with gloo on the CPU: sharded MoE forward and the expert weight gather."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, tp, ep, etp", [("qwen3_moe", 1, 2, 1), ("qwen2_moe", 2, 2, 1), ("qwen3_moe", 2, 1, 2)]
)
def test_expert_parallel_forward_and_weight_gather_match_hf(family, tp, ep, etp, hf_dirs, tmp_path):
    pytest.importorskip("megatron.core")
    out = tmp_path / "result.json"
    worker = Path(__file__).with_name("ep2_worker.py")
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
        str(out),
        str(tp),
        str(ep),
        str(etp),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["ranks"]["ep_size"] == ep and result["ranks"]["etp_size"] == etp
    assert result["logits_max_abs_diff"] < 5e-5
    assert result["weights_bit_exact"]
