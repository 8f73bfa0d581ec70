"""Sample alignment invariants under random appends (hypothesis)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slime.types import Group, Sample, Status

segment = st.tuples(
    st.lists(st.integers(0, 1000), max_size=8),
    st.integers(0, 20),
    st.booleans(),
)


@given(st.lists(segment, max_size=12))
def test_random_appends_keep_every_per_token_list_aligned(segments):
    s = Sample(prompt_ids=[1, 2])
    expect_ids, expect_versions, expect_mask = [], [], []
    for ids, version, trainable in segments:
        s.append(ids, [-0.5] * len(ids), version, trainable=trainable)
        expect_ids += ids
        expect_versions += [version] * len(ids)
        expect_mask += [int(trainable)] * len(ids)
        s.check_aligned()
    assert s.response_ids == expect_ids
    assert s.versions == expect_versions
    assert s.loss_mask == expect_mask
    assert len(s.rollout_logprobs) == len(expect_ids)


@given(st.lists(st.integers(0, 9), min_size=1, max_size=10), st.integers(-3, 3))
def test_misaligned_append_raises_and_appends_nothing(ids, delta):
    s = Sample(prompt_ids=[1])
    s.append([5], [-0.1], 0)
    if delta == 0:
        delta = 1
    bad_len = max(0, len(ids) + delta)
    if bad_len == len(ids):
        bad_len += 1
    with pytest.raises(ValueError, match="token_ids"):
        s.append(ids, [0.0] * bad_len, 1)
    with pytest.raises(ValueError, match="versions"):
        s.append(ids, [0.0] * len(ids), [1] * bad_len)
    assert s.response_ids == [5] and s.versions == [0] and s.loss_mask == [1]


def test_per_token_versions_from_spans_and_staleness_mask():
    s = Sample(prompt_ids=[1])
    s.append([11, 12], [-0.1, -0.2], 3)
    s.append([13, 14], [-0.3, -0.4], [5, 6])
    assert s.versions == [3, 3, 5, 6] and s.num_versions_spanned == 3
    assert s.mask_stale(current_version=6, max_staleness=2) == 2
    assert s.loss_mask == [0, 0, 1, 1]


def test_sample_round_trips_through_msgspec():
    s = Sample(prompt_ids=[1], status=Status.PARTIAL, group_id=4, index=2)
    s.append([7], [-0.25], 2, trainable=False)
    g = Group(group_id=4, samples=[s])
    back = msgspec.json.decode(msgspec.json.encode(g), type=Group)
    assert back == g and back.samples[0].status is Status.PARTIAL


def test_teacher_logprobs_are_set_once_aligned_and_finite_and_round_trip():
    s = Sample(prompt_ids=[1], status=Status.COMPLETED)
    s.append([7, 8], [-0.25, -0.5], 2)
    with pytest.raises(ValueError, match="1 logprobs for 2 response tokens"):
        s.set_teacher_logprobs([-0.1])
    with pytest.raises(ValueError, match=r"logprob nan of response token 1 \(id 8\)"):
        s.set_teacher_logprobs([-0.1, float("nan")])
    assert s.teacher_logprobs is None
    s.set_teacher_logprobs([-0.1, -0.2])
    with pytest.raises(ValueError, match="already set"):
        s.set_teacher_logprobs([-0.1, -0.2])
    back = msgspec.json.decode(msgspec.json.encode(s), type=Sample)
    assert back.teacher_logprobs == [-0.1, -0.2]
    s.teacher_logprobs = [-0.1]  # only set_teacher_logprobs checks; check_aligned catches the rest
    with pytest.raises(ValueError, match="teacher_logprobs=1"):
        s.check_aligned()
