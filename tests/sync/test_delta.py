"""Delta weight sync: only what changed, bit-exact, checksum-verified, full-sync fallback; sizes after AdamW."""

from __future__ import annotations

import logging

import torch
from transformers import LlamaForCausalLM

from slime.config import SyncConfig
from slime.sync.codec import encode_tensor
from slime.sync.delta import DeltaWeightSync
from tests.sync.conftest import assert_holds, greedy_outputs, live_state

LR = 1e-6


def _delta_sync(pool, state, *, base=None, buffer_size=512 << 20) -> DeltaWeightSync:
    return DeltaWeightSync(
        SyncConfig(update_weight_buffer_size=buffer_size), pool=pool, state_fn=lambda: dict(state), base=base
    )


def _adamw_step(path, *, only: str | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(weights before, after) one AdamW step at ``LR`` on a next-token loss; ``only``: train just that tensor."""
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    params = [p for n, p in model.named_parameters() if only is None or n == only]
    model.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    ids = torch.randint(3, 64, (8, 24))
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.AdamW(params, lr=LR, weight_decay=0.0).step()
    return before, {n: t.detach().clone() for n, t in model.state_dict().items()}


async def test_delta_sends_only_the_changed_tensors_and_lands_bit_exact(engine, pool, v1_path, v2_state):
    base = {n: t.clone() for n, t in live_state(engine).items()}
    new = dict(base, **{n: v2_state[n] for n in ("lm_head.weight", "model.norm.weight")})
    sync = _delta_sync(pool, new, base=base)
    await sync.load(await sync.save(1), 1)
    assert_holds(engine, new)
    assert engine.weight_version == "1"
    # the pool knows it: a rejoining engine is compared with version 1 (not the start's 0), and the caches were
    # flushed at 1 (cache-hit tokens are not stamped with the start's version)
    assert pool.latest_version == "1" and pool.kv_cache_version == "1"
    assert sync.stats["num_changed_tensors"] == 2 and sync.stats["num_full_fallbacks"] == 0


async def test_delta_with_small_buckets_matches_a_full_sync(engine, pool, v2_state):
    sync = _delta_sync(pool, v2_state, base={n: t.clone() for n, t in live_state(engine).items()}, buffer_size=2000)
    await sync.load(await sync.save(1), 1)
    assert_holds(engine, v2_state)
    assert sync.stats["num_full_fallbacks"] == 0


async def test_a_checksum_mismatch_falls_back_to_a_full_sync_and_says_so(engine, pool, v2_state, caplog):
    base = {n: t.clone() for n, t in live_state(engine).items()}
    with torch.no_grad():  # the engine's copy drifted from what the trainer believes it holds
        live_state(engine)["lm_head.weight"][3, 5] += 0.25
    sync = _delta_sync(pool, v2_state, base=base)
    with caplog.at_level(logging.WARNING, logger="slime.sync.delta"):
        await sync.load(await sync.save(1), 1)
    assert "sha256 mismatch on 1 of" in caplog.text and "falling back to a full sync" in caplog.text
    assert sync.stats["num_full_fallbacks"] == 1
    assert_holds(engine, v2_state)


async def test_a_delta_against_another_version_is_refused_and_replaced_by_a_full_sync(
    engine, pool, v1_path, v2_state, caplog
):
    state = dict(v2_state)
    sync = _delta_sync(pool, state)
    await sync.load(await sync.save(1), 1)  # no base: full
    await pool.update_weights_from_disk(str(v1_path), weight_version="other")  # behind the sync's back
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with caplog.at_level(logging.WARNING, logger="slime.sync.delta"):
        await sync.load(await sync.save(2), 2)
    assert "the engine holds 'other'" in caplog.text and sync.stats["num_full_fallbacks"] == 1
    assert_holds(engine, state)
    assert engine.weight_version == "2"


async def test_after_a_full_parameter_adamw_step_delta_is_bit_exact_but_not_under_5_percent(engine, pool, v1_path):
    """Every element moves by about lr: nothing is sparse. The ``diff`` encoding keeps ~1/4 of the bytes."""
    before, after = _adamw_step(v1_path)
    changed = sum(int((before[n] != after[n]).sum()) for n in after) / sum(t.numel() for t in after.values())
    sync = _delta_sync(pool, after, base=before)
    await sync.load(await sync.save(1), 1)
    assert_holds(engine, after)
    assert changed > 0.9
    assert 0.05 < sync.stats["bytes_ratio"] < 0.35, sync.stats


async def test_after_an_adamw_step_that_trains_only_the_lm_head_delta_is_under_5_percent(engine, pool, v1_path):
    before, after = _adamw_step(v1_path, only="lm_head.weight")
    sync = _delta_sync(pool, after, base=before)
    outputs_before = await greedy_outputs(pool.clients[0])
    await sync.load(await sync.save(1), 1)
    assert_holds(engine, after)
    assert sync.stats["num_changed_tensors"] == 1 and sync.stats["bytes_ratio"] <= 0.05, sync.stats
    assert len(await greedy_outputs(pool.clients[0])) == len(outputs_before)


def test_on_a_bf16_engine_one_full_parameter_adamw_step_is_under_5_percent(v1_path):
    """What SGLang serves is bf16: at lr 1e-6 few bf16 values change, each by one ulp (``sparse``)."""
    before, after = _adamw_step(v1_path)
    encoded = [encode_tensor(n, before[n].bfloat16(), after[n].bfloat16()) for n in after]
    sent = sum(e.nbytes for e in encoded if e is not None)
    full = sum(t.numel() * 2 for t in after.values())
    assert sent <= 0.05 * full, (sent, full)


async def test_an_update_where_nothing_changed_still_sets_the_version(engine, pool):
    base = {n: t.clone() for n, t in live_state(engine).items()}
    sync = _delta_sync(pool, base, base=base)
    await sync.load(await sync.save(4), 4)
    assert engine.weight_version == "4" and sync.stats["num_changed_tensors"] == 0
    assert_holds(engine, base)
