"""GLM-4.7-Flash under torchrun with gloo on the CPU: TP (with sequence parallelism), EP and ETP shards of
``test_glm4_moe_lite.py``'s "flash" model through ``ep2_worker.py``: the sharded forward's logits equal transformers'
Glm4MoeLiteForCausalLM's and the weights gathered back for weight sync (expert bias included) equal the checkpoint
bit for bit.

The test is DeepSeek-V3's (``test_deepseek_v3_parallel``), collected here again: pytest resolves its ``ds_dir``
argument to this module's fixture, the GLM-4.7-Flash checkpoint.
"""

from __future__ import annotations

import pytest
from test_deepseek_v3_parallel import test_sharded_forward_and_weight_gather_match_hf
from test_glm4_moe_lite import make_glm_lite

__all__ = ["test_sharded_forward_and_weight_gather_match_hf"]


@pytest.fixture(scope="module")
def ds_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("hf_glm_lite_parallel")
    make_glm_lite("flash").save_pretrained(path)
    return str(path)
