"""megatron-core GPTModel built from HF configs: forward logits match HF's on CPU in fp32."""

from __future__ import annotations

import pytest
import torch

from slime.config import MegatronConfig

pytest.importorskip("megatron.core", reason="the megatron backend's optional extra (slime[megatron]) is not installed")


FAMILIES = ["llama", "qwen2", "qwen3"]


def _build(hf_dir: str):
    from slime.train.megatron.arch import ModelArch, load_hf_config
    from slime.train.megatron.model import HFCheckpointReader, build_gpt_model, load_hf_weights, transformer_config

    arch = ModelArch.from_hf_config(load_hf_config(hf_dir))
    config = transformer_config(arch, MegatronConfig(), use_cpu_initialization=True)
    model = build_gpt_model(arch, config, tp_size=1)
    load_hf_weights(model, HFCheckpointReader(hf_dir), arch, tp_size=1, tp_rank=0)
    return arch, model.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_megatron_logits_match_hf_on_packed_sequences(family, hf_dirs, megatron_cpu, make_hf):
    """Three ragged sequences packed with padding: each one's logits equal HF's forward of it alone."""
    from slime.train.batch import TrainBatch
    from slime.train.megatron.packing import pack_samples

    arch, model = _build(hf_dirs[family])
    hf = make_hf(family)
    lens = [7, 3, 5]
    torch.manual_seed(1)
    ids = torch.zeros(3, 7, dtype=torch.long)
    for i, n in enumerate(lens):
        ids[i, :n] = torch.randint(0, arch.vocab_size, (n,))
    z = torch.zeros(3, 6)
    batch = TrainBatch(
        input_ids=ids,
        attention_mask=(torch.arange(7) < torch.tensor(lens)[:, None]).long(),
        loss_mask=z,
        rollout_logprobs=z,
        advantages=z,
        staleness=z.long(),
        sample_advantages=torch.zeros(3),
        rewards=torch.zeros(3),
        seq_lens=torch.tensor(lens),
        response_mask=z,
    )
    mb = pack_samples(batch, [2, 0, 1], pad_token_id=0, pad_to=4, head_dim=arch.head_dim, rope_theta=arch.rope_theta)
    with torch.no_grad():
        logits = model(
            input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=None, packed_seq_params=mb.params
        )
    logits = logits.reshape(mb.num_tokens, -1)[:, : arch.vocab_size]
    bounds = mb.params.seq_bounds
    with torch.no_grad():
        for j, s in enumerate([2, 0, 1]):
            ref = hf(input_ids=ids[s : s + 1, : lens[s]]).logits[0]
            got = logits[bounds[j] : bounds[j + 1]]
            torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
