"""Rollout records in the format their suffix names (``slime.loop.record.FORMATS``): JSON lines a plain JSON
reader takes, real ``torch.save`` files for ``.pt``, msgpack otherwise; each read back whole by
``load_rollout_record``. A rollout-only run without ``--save-debug-rollout-data`` keeps its groups in
``RUN_DIR/rollouts`` (issue 31 item 7)."""

from __future__ import annotations

import json

import pytest

from slime.config import DebugConfig, EngineConfig, RolloutConfig, SyncConfig, TrainConfig
from slime.errors import DataError
from slime.loop.plan import run_plan
from slime.loop.record import load_rollout_record, save_rollout_record
from slime.types import Group, Sample, Status


def _groups() -> list[Group]:
    samples = []
    for i in range(2):
        s = Sample(prompt_ids=[0, 5, 9], prompt="w5 w9", label="w7", group_id=4, index=i, metadata={"row": 3})
        s.append([7, 8], [-0.5, -0.125], 0)
        s.response, s.reward, s.status = "w7 w8", float(i), Status.COMPLETED
        s.evidence["note"] = {"k": i}
        samples.append(s)
    return [Group(group_id=4, samples=samples, data_index=3)]


@pytest.mark.parametrize("suffix", [".jsonl", ".pt", ".msgpack"])
def test_each_format_reads_back_the_same_groups(tmp_path, suffix):
    template = str(tmp_path / f"rollout_{{rollout_id}}{suffix}")
    save_rollout_record(template, 2, _groups(), policy_version=1)
    record = load_rollout_record(template, 2)
    assert (record.rollout_id, record.policy_version) == (2, 1) and record.groups == _groups()


def test_jsonl_is_one_group_a_line_for_a_plain_json_reader(tmp_path):
    path = save_rollout_record(str(tmp_path / "r_{rollout_id}.jsonl"), 1, _groups() * 2, policy_version=0)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["rollout_id"] == 1 and lines[0]["policy_version"] == 0
    sample = lines[0]["group"]["samples"][1]
    assert sample["response_ids"] == [7, 8] and sample["reward"] == 1.0 and sample["label"] == "w7"


def test_a_pt_record_is_a_real_torch_file(tmp_path):
    import torch

    path = save_rollout_record(str(tmp_path / "r_{rollout_id}.pt"), 1, _groups(), policy_version=0)
    loaded = torch.load(path, weights_only=True)  # before: msgpack under a .pt name, torch.load raised
    assert loaded["rollout_id"] == 1 and loaded["groups"][0]["samples"][0]["rollout_logprobs"] == [-0.5, -0.125]


def test_a_file_of_another_format_is_named_as_not_a_record(tmp_path):
    (tmp_path / "r_1.jsonl").write_text('{"not": "a record"}\n')
    with pytest.raises(DataError, match=r"r_1.jsonl: not a rollout record"):
        load_rollout_record(str(tmp_path / "r_{rollout_id}.jsonl"), 1)


def test_a_rollout_only_run_keeps_its_groups_in_the_run_folder_by_default(tmp_path):
    args = (RolloutConfig(), TrainConfig(), EngineConfig(), SyncConfig())
    plan = run_plan(DebugConfig(debug_rollout_only=True), *args, seed=0, run_dir=str(tmp_path))
    assert plan.record_template == str(tmp_path / "rollouts" / "rollout_{rollout_id}.jsonl")
    given = run_plan(
        DebugConfig(debug_rollout_only=True, save_debug_rollout_data="x/{rollout_id}.msgpack"), *args, seed=0
    )
    assert given.record_template == "x/{rollout_id}.msgpack"
    assert run_plan(DebugConfig(), *args, seed=0, run_dir=str(tmp_path)).record_template is None  # a run that trains
