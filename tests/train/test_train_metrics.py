"""``TrainMetrics`` (slime/train_metrics.py): the flat ``train/<name>`` keys of metrics.jsonl and back."""

from __future__ import annotations

import pytest

from slime.train_metrics import TrainMetrics


def test_to_dict_leaves_out_unset_fields_and_flattens_the_expert_loads_in_field_order():
    m = TrainMetrics(loss=0.5, moe_expert_load=[0.25, 0.75], reward_mean=1.0, policy_version=3.0)
    assert list(m.to_dict().items()) == [
        ("reward_mean", 1.0), ("moe_expert_load_0", 0.25), ("moe_expert_load_1", 0.75), ("loss", 0.5), ("policy_version", 3.0),
    ]  # fmt: skip
    assert TrainMetrics().to_dict() == {}


def test_from_dict_reads_back_what_to_dict_wrote():
    m = TrainMetrics(pg_clipfrac=0.1, nll=2.0, moe_expert_load=[0.5, 0.25, 0.25], lr=1e-6, num_samples=8.0)
    assert TrainMetrics.from_dict(m.to_dict()) == m
    assert TrainMetrics.from_dict({"moe_expert_load_1": 0.4, "moe_expert_load_0": 0.6}).moe_expert_load == [0.6, 0.4]


def test_from_dict_refuses_a_metric_it_would_drop_unless_told_to_ignore_it():
    with pytest.raises(ValueError, match="not_a_metric"):
        TrainMetrics.from_dict({"loss": 1.0, "not_a_metric": 2.0})
    assert TrainMetrics.from_dict({"loss": 1.0, "not_a_metric": 2.0}, strict=False) == TrainMetrics(loss=1.0)
