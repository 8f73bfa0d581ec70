"""Trajectory identity (sampling_seed, rid stem, prompt), resume accounting and deterministic tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.rollout.generate import request_id, request_stem
from slime.servers.sim import SimConfig
from slime.servers.sim.lengths import make_length_distribution
from slime.servers.sim.trajectory import TrajectoryTracker, rid_stem
from slime.types import Sample


def tracker(**overrides) -> TrajectoryTracker:
    config = SimConfig(**dict(dict(response_len_median=50, response_len_p99=400), **overrides))
    return TrajectoryTracker(config, make_length_distribution(config))


@pytest.mark.parametrize(
    "rid, stem",
    [
        ("slime-g7-s3-a0-r0-", "slime-g7-s3"),
        ("slime-g7-s3-a12-r11-", "slime-g7-s3"),
        ("plain", "plain"),
        ("x-a1-r2", "x"),
    ],
)
def test_rid_stem_drops_the_abort_and_resume_counters(rid, stem):
    assert rid_stem(rid) == stem


def test_rid_stem_matches_slimes_request_id_before_and_after_a_resume():
    sample = Sample(prompt_ids=[1], group_id=4, index=2)
    first = request_id(sample)
    sample.num_aborts, sample.num_resumes = 1, 1
    assert rid_stem(first) == rid_stem(request_id(sample)) == request_stem(sample) == "slime-g4-s2"


def test_same_seed_and_prompt_give_the_same_total_on_a_fresh_tracker():
    a = tracker().resolve([1, 2, 3], sampling_seed=9, rid=None)
    b = tracker().resolve([1, 2, 3], sampling_seed=9, rid="ignored-when-a-seed-is-sent")
    assert a == b and a.prompt_len == 3


def test_one_seed_reused_across_prompts_gives_each_prompt_its_own_length():
    t = tracker()
    totals = {t.resolve([p, p + 1], sampling_seed=42, rid=None).total for p in range(30)}
    assert len(totals) > 10


def test_a_resume_continues_the_remembered_trajectory_and_counts_the_carried_tokens():
    t = tracker()
    first = t.resolve([5, 6, 7], sampling_seed=1, rid=None)
    partial, _ = t.tokens(first, 0, 4)
    resumed = t.resolve([5, 6, 7] + partial, sampling_seed=1, rid=None)
    assert resumed == first  # already = 7 - 3 = 4
    by_rid = t.resolve([5, 6, 7], sampling_seed=None, rid="slime-g0-s0-a0-r0-")
    assert t.resolve([5, 6, 7, 1, 1], sampling_seed=None, rid="slime-g0-s0-a1-r1-") == by_rid


def test_a_request_without_seed_or_rid_is_keyed_on_all_its_input_ids():
    t = tracker()
    a = t.resolve([5, 6, 7], sampling_seed=None, rid=None)
    assert t.resolve([5, 6, 7, 8], sampling_seed=None, rid=None).prompt_len == 4
    assert t.resolve([5, 6, 7], sampling_seed=None, rid=None) == a and t.num_tracked == 0


def test_tokens_end_on_eos_only_and_are_deterministic_per_position():
    t = tracker(eos_token_id=2, vocab_size=100)
    traj = t.resolve([3, 4], sampling_seed=5, rid=None)
    ids, lps = t.tokens(traj, 0, traj.total)
    assert ids[-1] == 2 and all(3 <= x < 100 for x in ids[:-1])
    assert all(-3.0002 < lp < 0 for lp in lps) and len(lps) == len(ids)
    head, head_lps = t.tokens(traj, 0, traj.total // 2)
    tail, tail_lps = t.tokens(traj, traj.total // 2, traj.total)
    assert head + tail == ids and head_lps + tail_lps == lps
    assert t.tokens(traj, 0, 3, logprobs=False) == (ids[:3], [])


def test_an_eos_inside_the_vocab_range_never_appears_before_the_last_position():
    t = tracker(eos_token_id=5, vocab_size=8, response_len_median=300, response_len_p99=300)
    traj = t.resolve([1], sampling_seed=0, rid=None)
    ids, _ = t.tokens(traj, 0, traj.total)
    assert 5 not in ids[:-1] and ids[-1] == 5


def test_lengths_are_capped_by_max_response_len():
    t = tracker(response_len_median=5000, response_len_p99=5000, max_response_len=64)
    assert t.resolve([1], sampling_seed=3, rid=None).total == 64


@settings(max_examples=50, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 50_000), min_size=1, max_size=40),
    seed=st.integers(0, 2**31),
    cut=st.floats(0.0, 1.0),
)
def test_any_abort_point_resumes_to_the_same_trajectory_and_tokens(prompt, seed, cut):
    t = tracker()
    first = t.resolve(prompt, sampling_seed=seed, rid=None)
    k = int(cut * (first.total - 1))
    partial, _ = t.tokens(first, 0, k)
    resumed = t.resolve(prompt + partial, sampling_seed=seed, rid=None)
    assert resumed == first
    assert partial + t.tokens(resumed, k, resumed.total)[0] == t.tokens(first, 0, first.total)[0]
