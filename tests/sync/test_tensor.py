"""Tensor weight sync (colocated): safetensors payloads into the embedded engine, bit-exact."""

from __future__ import annotations

import base64
import pickle

import pytest
import torch

from slime.config import SyncConfig
from slime.errors import EngineRequestError
from slime.sync.base import weight_update_session
from slime.sync.tensor import TensorWeightSync
from slime.sync.wire import serialize_cuda_ipc
from tests.sync.conftest import assert_holds


@pytest.mark.parametrize("buffer_size", [512 << 20, 3000])
async def test_tensor_sync_is_bit_exact_whatever_the_bucket_size(engine, pool, v2_state, buffer_size):
    sync = TensorWeightSync(
        SyncConfig(update_weight_buffer_size=buffer_size), pool=pool, state_fn=lambda: dict(v2_state)
    )
    await sync.load(await sync.save(7), 7)
    assert_holds(engine, v2_state)
    assert engine.weight_version == "7" and (sync.stats["num_buckets"] > 1) == (buffer_size < 1 << 20)


async def test_the_embedded_engine_refuses_pickles_and_keeps_its_weights(engine, pool, v2_state):
    before = {n: t.clone() for n, t in engine.loaded.model.state_dict().items()}
    payload = base64.b64encode(pickle.dumps([("lm_head.weight", v2_state["lm_head.weight"])])).decode()
    async with weight_update_session(pool.clients):
        with pytest.raises(EngineRequestError) as exc:
            await pool.clients[0].update_weights_from_tensor([payload], weight_version="1")
    assert exc.value.status == 400 and "does not unpickle" in exc.value.engine_message
    assert_holds(engine, before)


def test_cuda_ipc_payloads_are_refused_for_cpu_tensors():
    with pytest.raises(ValueError, match="CUDA IPC payloads need CUDA tensors"):
        serialize_cuda_ipc([("w", torch.zeros(2))])
