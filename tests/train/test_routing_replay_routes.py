"""Route alignment for ``--use-rollout-routing-replay``, from the engine's answers to the packed micro-batch.

Every route row here is ``1000 * sample + 10 * position + request`` (for each layer and slot), so a row that lands
at the wrong token, or comes from the wrong request, shows up as the wrong number.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from slime.engines.protocol import FinishReason, GenerateResult
from slime.rollout.generate import generate
from slime.routed_experts import encode_rows, merge_segment, route_rows, stack_routes
from slime.train.batch import build_train_batch
from slime.train.megatron.packing import pack_samples
from slime.train.megatron.routing_replay import packed_routes
from slime.types import Group, Sample, Status

LAYERS, K = 3, 2  # layer 0 dense (zeros on the wire), 1 and 2 MoE
MOE = (False, True, True)


def _rows(num: int, *, sample: int = 0, request: int = 0, start: int = 0) -> np.ndarray:
    """[num, LAYERS * K] rows for positions start.. of ``sample`` from ``request`` (module docstring)."""
    pos = np.arange(start, start + num)[:, None]
    return np.broadcast_to(1000 * sample + 10 * pos + request, (num, LAYERS * K)).astype(np.int32)


def test_a_resumed_sample_keeps_each_tokens_row_from_the_request_that_sampled_it():
    prompt, first, second = 4, 3, 2  # segment 1 sends 4 tokens, samples 3; segment 2 sends 7, samples 2
    seg1 = encode_rows(_rows(prompt + first - 1, request=1))
    seg2 = encode_rows(_rows(prompt + first + second - 1, request=2))
    kept = merge_segment(None, seg1, prompt_len=prompt, input_len=prompt, num_new=first)
    merged = route_rows(merge_segment(kept, seg2, prompt_len=prompt, input_len=prompt + first, num_new=second), 8)
    # positions 0..2 (the prompt's, no trained logprob) and 6..7 from request 2; 3..5 (they sampled seg 1) from 1
    assert merged[:, 0].tolist() == [2, 12, 22, 31, 41, 51, 62, 72]
    with pytest.raises(ValueError, match="not 9 rows"):
        merge_segment(kept, seg2, prompt_len=prompt, input_len=prompt + first, num_new=second + 1)


class _Pool:
    """Answers each request with the next scripted (tokens, finish) and routes covering input + output - 1."""

    kv_cache_version = None

    def __init__(self, script: list[tuple[list[int], str]]):
        self.script, self.calls = list(script), 0

    async def generate(self, input_ids, sampling_params, **_):
        tokens, finish = self.script.pop(0)
        self.calls += 1
        rows = _rows(len(input_ids) + len(tokens) - 1, request=self.calls)
        return GenerateResult(
            output_ids=tokens, output_logprobs=[0.0] * len(tokens), finish_reason=FinishReason(type=finish),
            routed_experts=encode_rows(rows),
        )  # fmt: skip


async def test_generate_merges_the_routes_of_an_aborted_and_resumed_sample():
    sample = Sample(prompt_ids=[1, 2, 3])
    pool = _Pool([([7, 8], "abort"), ([9], "stop")])
    await generate(sample, {}, pool=pool, max_response_len=8, engine_version=0)
    assert sample.status is Status.PARTIAL
    await generate(sample, {}, pool=pool, max_response_len=8, engine_version=0)
    assert sample.status is Status.COMPLETED and sample.response_ids == [7, 8, 9]
    rows = route_rows(sample.routed_experts or "", 5)  # 3 + 3 - 1
    # positions 2 and 3 produced tokens 7 and 8 (request 1); 4 produced 9 (request 2); the prompt's from the newest
    assert rows[:, 0].tolist() == [2, 12, 21, 31, 42]


def _group(lengths: list[tuple[int, int]]) -> Group:
    samples = []
    for i, (p, r) in enumerate(lengths):
        s = Sample(prompt_ids=list(range(1, p + 1)), index=i, reward=float(i), status=Status.COMPLETED)
        s.append(list(range(10, 10 + r)), [0.0] * r, 0)
        s.routed_experts = encode_rows(_rows(p + r - 1, sample=i))
        samples.append(s)
    return Group(group_id=0, samples=samples)


def test_packed_routes_follow_the_packed_tokens_and_keep_the_moe_layers():
    group = _group([(3, 2), (2, 1), (4, 3)])
    batch = build_train_batch([group], pad_token_id=0, current_version=0)
    routes = stack_routes(group.samples, batch.loss_mask.shape[1])
    assert routes is not None and routes.shape == (3, 6, LAYERS * K)
    mb = pack_samples(batch, [2, 0], pad_token_id=0, pad_to=4, head_dim=8, rope_theta=10000.0)
    t = mb.num_tokens  # 7 + 5 tokens, a multiple of 4 already
    packed = packed_routes(routes, mb.samples, batch.seq_lens, t, moe_layers=MOE, topk=K)
    assert packed.shape == (t, 2, K) and packed.dtype == torch.int32
    expected = [2000 + 10 * q for q in range(6)] + [0] + [10 * q for q in range(4)] + [0]
    # each packed position: the route of the token the model is fed there; last tokens and padding: experts 0..k-1
    assert packed[:, 0, 0].tolist() == expected and packed[6, 1].tolist() == [0, 1]
    with pytest.raises(ValueError, match="3 layers x top-3"):
        packed_routes(routes, mb.samples, batch.seq_lens, t, moe_layers=MOE, topk=3)


def test_a_batch_mixing_samples_with_and_without_routes_is_refused():
    group = _group([(3, 2), (2, 1)])
    group.samples[1].routed_experts = None
    with pytest.raises(ValueError, match="index=1\\) has no routed_experts"):
        stack_routes(group.samples, 4)
    group.samples[0].routed_experts = None
    assert stack_routes(group.samples, 4) is None


@pytest.mark.parametrize("layout", [dict(sequence_parallel=True), dict(cp_size=2), dict(pp_size=2)], ids=str)
def test_the_step_refuses_routes_on_a_layout_where_a_router_sees_part_of_the_tokens(layout):
    from slime.train.megatron.routing_replay import StepRoutes

    group = _group([(3, 2), (2, 1)])
    batch = build_train_batch([group], pad_token_id=0, current_version=0)
    batch = dataclasses.replace(batch, routed_experts=stack_routes(group.samples, batch.loss_mask.shape[1]))
    mb = pack_samples(batch, [0, 1], pad_token_id=0, pad_to=1, head_dim=8, rope_theta=10000.0)
    routes = StepRoutes(
        torch.nn.Linear(2, 2),
        moe_layers=MOE,
        topk=K,
        **{**dict(sequence_parallel=False, cp_size=1, pp_size=1), **layout},
    )
    with pytest.raises(ValueError, match="every router must see all of a micro-batch's tokens"):
        routes.attach(batch, mb)
    without = dataclasses.replace(batch, routed_experts=None)
    assert routes.attach(without, mb).routes is None  # no routes: nothing to check, nothing replayed
