"""How a whole run ends when its data or its samples are bad: refused at load with ``file:line``, or an
error (not a silent success) when it trained nothing; its files are strict JSON either way.

The runs replay recorded groups (``--load-debug-rollout-data``): no engine, a tiny model, a second or two.
"""

from __future__ import annotations

import json
import re

import msgspec
import pytest

from slime.config import Config, DataConfig, DebugConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import DataError, RunError
from slime.loop.driver import run_training
from slime.loop.record import save_rollout_record
from slime.types import Group, Sample, Status
from tests.fixtures.tiny_model import write_tiny_llama


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", seed=0, with_tokenizer=True)


def _config(tmp_path, model, prompts, *, template=None, rm_type=None) -> Config:
    return Config(
        data=DataConfig(prompt_data=str(prompts)),
        rollout=RolloutConfig(n_samples_per_prompt=2, rm_type=rm_type),
        loop=LoopConfig(mode="sync", rollout_batch_size=1, over_sampling_batch_size=1, num_rollout=2),
        train=TrainConfig(lr=1e-3, global_batch_size=2, micro_batch_size=2),
        engine=EngineConfig(hf_checkpoint=str(model)),
        debug=DebugConfig(load_debug_rollout_data=template),
        run_dir=str(tmp_path / "run"),
    )


def _prompts(tmp_path, rows):
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _record(tmp_path, *, failed: bool) -> str:
    """Two steps of one group of two samples each; ``failed``: every sample FAILED (reward placeholder 0.0)."""
    template = str(tmp_path / "rec" / "rollout_{rollout_id}.msgpack")
    for step in (1, 2):
        samples = []
        for i in range(2):
            s = Sample(prompt_ids=[0, 5, 6], group_id=step, index=i)
            s.append([7 + i, 8, 1], [-1.0, -1.0, -1.0], policy_version=step - 1)
            s.status, s.reward = (Status.FAILED, 0.0) if failed else (Status.COMPLETED, float(i))
            samples.append(s)
        save_rollout_record(
            template, step, [Group(group_id=step, samples=samples, rollout_id=step)], policy_version=step - 1
        )
    return template


def _strict(path):
    def refuse(name):
        raise AssertionError(f"{path.name} is not JSON: {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


async def test_a_run_whose_every_sample_failed_is_an_error_after_its_files_are_written(tmp_path, model):
    config = _config(
        tmp_path, model, _prompts(tmp_path, [{"prompt": "w5 w6"}]), template=_record(tmp_path, failed=True)
    )
    with pytest.raises(RunError, match=r"the run trained nothing: every one of the 4 samples of its 2 steps FAILED"):
        await run_training(config, progress=False)
    run = tmp_path / "run"
    summary = _strict(run / "summary.json")
    assert (
        summary["eval_accuracy_before"] is None and summary["eval_accuracy_after"] is None
    )  # no eval set: null, not NaN
    assert (
        summary["trained_tokens"] == 0
    )  # says what the error says, beside groups_trained (groups that reached the trainer)
    steps = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"]
    assert [(r["failed_samples_in_batch"], r["trained_tokens"]) for r in steps] == [(2, 0), (2, 0)]
    assert (run / "report.txt").is_file()


async def test_a_run_that_trained_returns_its_summary_and_writes_strict_json(tmp_path, model):
    config = _config(
        tmp_path, model, _prompts(tmp_path, [{"prompt": "w5 w6"}]), template=_record(tmp_path, failed=False)
    )
    summary = await run_training(config, progress=False)
    assert (
        summary["final_policy_version"] == 2
        and summary["eval_accuracy_before"] is None
        and summary["trained_tokens"] > 0
    )
    assert _strict(tmp_path / "run" / "summary.json")["eval_accuracy_after"] is None


async def test_a_prompt_without_a_label_is_refused_at_load_when_the_reward_reads_labels(tmp_path, model):
    prompts = _prompts(tmp_path, [{"prompt": "w5", "label": "1"}, {"prompt": "w6", "label": None}])
    with pytest.raises(
        DataError,
        match="^" + re.escape(f"{prompts}:2: key 'label' (--label-key) is null; the reward needs a reference answer"),
    ):
        await run_training(_config(tmp_path, model, prompts, rm_type="math"), progress=False)


async def test_a_prompt_over_rollout_max_prompt_len_is_refused_at_load_with_file_and_line(tmp_path, model):
    prompts = _prompts(
        tmp_path, [{"prompt": "w5", "label": "1"}, {"prompt": "w5 w6 w7 w8 w9 w5 w6 w7 w8 w9", "label": "1"}]
    )
    config = _config(tmp_path, model, prompts)
    config = msgspec.structs.replace(config, data=msgspec.structs.replace(config.data, rollout_max_prompt_len=4))
    with pytest.raises(
        DataError,
        match="^" + re.escape(f"{prompts}:2: the prompt renders to ") + r"\d+ tokens, over --rollout-max-prompt-len 4",
    ):
        await run_training(config, progress=False)


async def test_lr_warmup_fraction_warms_up_over_that_fraction_of_the_runs_optimizer_steps(tmp_path, model):
    config = _config(
        tmp_path, model, _prompts(tmp_path, [{"prompt": "w5 w6"}]), template=_record(tmp_path, failed=False)
    )
    # 2 steps x 1 group x 2 samples / --global-batch-size 2 = 2 optimizer steps; 0.99 x 2 -> 2 warm-up steps
    config = msgspec.structs.replace(
        config,
        train=msgspec.structs.replace(
            config.train, megatron=msgspec.structs.replace(config.train.megatron, lr_warmup_fraction=0.99)
        ),
    )
    await run_training(config, progress=False)
    steps = [
        r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "step"
    ]
    assert [r["train/lr"] for r in steps] == pytest.approx([5e-4, 1e-3])
