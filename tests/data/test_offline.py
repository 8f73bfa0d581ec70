"""Offline samples: rows of one prompt form a group, tokens carry OFFLINE_VERSION, bad rows are named."""

from __future__ import annotations

import json

import pytest

from slime.data.offline import OfflineSource, load_offline_data
from slime.errors import DataError
from slime.types import OFFLINE_VERSION, Status


def tokenize(text, tools=None):
    return [1] + [3 + ord(c) % 50 for c in text]


def encode(text):
    return [3 + ord(c) % 50 for c in text]


def _write(tmp_path, rows):
    p = tmp_path / "offline.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


ROWS = [
    {"prompt": "1+1=", "label": "2", "response": "2", "reward": 1.0, "logprobs": [-0.5]},
    {"prompt": "2+2=", "label": "4", "response": "5"},
    {"prompt": "1+1=", "label": "2", "response": "3", "reward": 0.0, "logprobs": [-2.5]},
    {"prompt": "2+2=", "label": "4", "response": "44"},
]


def test_rows_of_one_prompt_become_one_group_of_offline_samples(tmp_path):
    groups = load_offline_data(_write(tmp_path, ROWS), tokenize=tokenize, encode=encode, group_size=2)
    assert [g.row.prompt for g in groups] == ["1+1=", "2+2="] and [len(g.samples) for g in groups] == [2, 2]
    source = OfflineSource(groups)
    g = source.next_group(group_id=7, rollout_id=3)
    assert g.group_id == 7 and g.rollout_id == 3 and g.data_index == 0
    assert [s.response for s in g.samples] == ["2", "3"] and [s.reward for s in g.samples] == [1.0, 0.0]
    for s in g.samples:
        s.check_aligned()
        assert s.versions == [OFFLINE_VERSION] and s.loss_mask == [1] and s.status is Status.COMPLETED
        assert s.metadata == {"offline": True, "offline_logprobs": True} and s.prompt_ids == tokenize("1+1=")
    assert g.samples[1].rollout_logprobs == [-2.5]
    h = source.next_group(group_id=8, rollout_id=3)
    assert [s.rollout_logprobs for s in h.samples] == [[0.0], [0.0, 0.0]] and h.samples[0].reward is None
    assert not any(s.metadata["offline_logprobs"] for s in h.samples), "missing logprobs are computed before training"
    assert source.next_group(group_id=9, rollout_id=4).samples[0].response == "2", "a second epoch starts over"


@pytest.mark.parametrize(
    "bad, why",
    [
        (
            {"prompt": "x", "response": "ab", "logprobs": [-1.0]},
            ":3: key 'logprobs' has 1 values for the 2 tokens of 'response'",
        ),
        ({"prompt": "x", "response": ""}, ":3: key 'response' must be a non-empty string"),
        ({"prompt": "x", "response": "a", "reward": "high"}, ":3: key 'reward' must be a number or null"),
    ],
)
def test_a_bad_offline_row_is_named_by_file_and_line(tmp_path, bad, why):
    p = _write(tmp_path, ROWS[:2] + [bad])
    with pytest.raises(DataError, match=str(p) + why):
        load_offline_data(p, tokenize=tokenize, encode=encode, group_size=2)


def test_a_prompt_with_the_wrong_number_of_rows_is_named(tmp_path):
    p = _write(tmp_path, ROWS[:3])
    with pytest.raises(DataError, match=r"prompt '2\+2=' has 1 rows, expected --n-samples-per-prompt=2"):
        load_offline_data(p, tokenize=tokenize, encode=encode, group_size=2)
    groups = load_offline_data(p, tokenize=tokenize, encode=encode, group_size=2, on_bad_data="skip")
    assert [g.row.prompt for g in groups] == ["1+1="]
