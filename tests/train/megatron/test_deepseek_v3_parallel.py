"""DeepSeek-V3 (MLA + DeepSeek-style MoE) under torchrun with gloo on the CPU: TP (with sequence parallelism), EP and
ETP shards of the same tiny model as test_deepseek_v3.py, through ``ep2_worker.py``: the sharded forward's logits equal
transformers' DeepseekV3ForCausalLM's and the weights gathered back for weight sync (expert bias included) equal the
checkpoint bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_deepseek_v3 import _make_hf


@pytest.fixture(scope="module")
def ds_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("hf_deepseek_parallel")
    _make_hf("yarn").save_pretrained(path)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("tp, ep, etp", [(1, 2, 1), (2, 2, 1), (2, 1, 2)])
def test_sharded_forward_and_weight_gather_match_hf(tp, ep, etp, ds_dir, tmp_path):
    pytest.importorskip("megatron.core")
    out = tmp_path / "result.json"
    worker = Path(__file__).with_name("ep2_worker.py")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(worker)]
    proc = subprocess.run(
        [*cmd, ds_dir, str(out), str(tp), str(ep), str(etp)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert (result["ranks"]["tp_size"], result["ranks"]["ep_size"], result["ranks"]["etp_size"]) == (tp, ep, etp)
    assert result["logits_max_abs_diff"] < 5e-5
    assert result["weights_bit_exact"]
