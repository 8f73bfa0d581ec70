"""``slime.step_record``: a step record written to ``metrics.jsonl`` decodes back to the same struct, and old runs' rows decode too."""

from __future__ import annotations

import json
import math

import msgspec
import pytest

from slime.obs import strict_json
from slime.step_record import SFTStepRecord, StepRecord, steps_of


def _record(**kw: object) -> StepRecord:
    fields: dict[str, object] = dict(
        policy_version=3, opd_reverse_kl=0.125, reward_mean=0.5, accuracy=0.5, response_len_mean=3.0, response_tokens=24,
        num_samples=8, trained_tokens=24, aborted_samples=2, resumed_samples=1, generated_tokens=24, tokens_per_s=100.0,
        step_time_s=1.25, rollout_wait_s=0.5, train_time_s=0.5, weight_sync_s=0.25, weight_sync_in_place=0,
        lag_histogram={0: 6, 1: 2}, off_policy_token_fraction=0.25, max_version_lag=1, max_versions_in_a_sample=2,
        train={"loss": 0.25, "grad_norm": 1.5, "moe_expert_load_0": 0.5}, weight_sync={"bytes": 1024.0}, step=3, time_s=9.5,
    )  # fmt: skip
    return StepRecord(**(fields | kw))  # type: ignore[arg-type]


def _as_file_has_it(row: dict) -> dict:
    return json.loads(strict_json.dumps(row))


def test_a_written_step_record_decodes_back_to_the_same_record():
    rec = _record()
    row = _as_file_has_it(rec.to_dict())
    assert row["train/loss"] == 0.25 and row["weight_sync/bytes"] == 1024.0 and row["opd/reverse_kl"] == 0.125
    assert row["lag_histogram"] == {"0": 6, "1": 2}  # JSON's string keys
    back = StepRecord.from_row(row)
    assert back == rec and back.to_dict() == rec.to_dict()


def test_a_rollout_only_record_round_trips_without_its_train_fields():
    rec = _record(
        train_time_s=None, weight_sync_s=None, weight_sync_in_place=None, train={}, weight_sync={}, opd_reverse_kl=None
    )
    row = _as_file_has_it(rec.to_dict())
    assert "train_time_s" not in row and "opd/reverse_kl" not in row and not any(k.startswith("train/") for k in row)
    assert StepRecord.from_row(row) == rec


def test_an_old_rows_missing_fields_default_its_unknown_keys_are_ignored_and_its_nulls_are_nan():
    old = {
        "kind": "step",
        "step": 2,
        "reward_mean": None,
        "aborted_samples": 4,
        "train/loss": None,
        "train/lr": 1e-3,
        "retired_key": 7,
    }
    rec = StepRecord.from_row(old)
    assert rec.step == 2 and rec.aborted_samples == 4 and rec.offline_groups == 0 and rec.lag_histogram == {}
    assert math.isnan(rec.reward_mean) and math.isnan(rec.tokens_per_s)  # null (a NaN written) and missing: NaN
    assert rec.train == {"lr": 1e-3} and rec.train_time_s is None  # a null metric is left out, as a missing one


def test_steps_of_decodes_only_the_step_rows_and_an_sft_run_as_sft_records():
    rows = [
        {"kind": "eval", "step": 0, "accuracy": 0.5},
        _record(step=1).to_dict(),
        {"kind": "step", "step": 2, "epoch": 1, "num_tokens": 9},
    ]
    assert [r.step for r in steps_of(rows, StepRecord)] == [1, 2]
    sft = steps_of([{"kind": "step", "step": 2, "epoch": 1, "num_tokens": 9, "train/loss": 0.5}], SFTStepRecord)
    assert sft == [SFTStepRecord(step=2, epoch=1, num_tokens=9, train={"loss": 0.5})]


def test_a_value_of_the_wrong_type_is_a_validation_error():
    with pytest.raises(msgspec.ValidationError):
        StepRecord.from_row({"kind": "step", "aborted_samples": "many"})
