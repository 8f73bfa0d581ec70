"""What an RL run prints: the step line (FAILED samples counted, no loss for a rollout-only step), the
eval-before line without an eval set and the end line (nothing claimed trained by a rollout-only run)."""

from __future__ import annotations

import json
import logging

import pytest

from slime.config import Config, DataConfig, DebugConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import RunError
from slime.loop import assemble
from slime.loop.driver import run_training
from slime.loop.outputs import format_done_line, format_step_line
from slime.step_record import StepRecord
from tests.fixtures.fake_pool import run_on_a_recording_fake_pool
from tests.fixtures.tiny_model import write_tiny_llama


def _record(**kw) -> StepRecord:
    fields = dict(
        policy_version=1, reward_mean=0.5, accuracy=0.5, response_len_mean=3.0, response_tokens=24, num_samples=8,
        truncated_samples=0, failed_samples_in_batch=0, trained_tokens=24, aborted_samples=0, resumed_samples=0,
        started_groups=2, generated_tokens=24, failed_samples=0, filtered_groups=0, dropped_stale_groups=0,
        offline_groups=0, buffer_evicted_groups=0, buffer_expired_groups=0, tokens_per_s=100.0, step_time_s=1.25,
        partial_groups_queued=0, ready_groups_left=0, rollout_wait_s=0.5, train_time_s=0.5, lag_histogram={0: 8},
        off_policy_token_fraction=0.0, max_version_lag=0, masked_stale_tokens=0, max_versions_in_a_sample=1,
        multi_version_samples=0, offline_tokens=0, train={"loss": 0.25}, step=1,
    )  # fmt: skip
    return StepRecord(**(fields | kw))


def test_the_step_line_counts_failed_samples_only_when_some_failed():
    assert "failed" not in format_step_line(_record())
    line = format_step_line(_record(failed_samples_in_batch=8, reward_mean=0.0, accuracy=0.0, trained_tokens=0))
    assert "reward 0.000 acc 0.000 failed 8/8 len" in line


def test_a_trained_step_shows_what_moves_and_a_rollout_only_step_nothing_trained():
    line = format_step_line(_record(train={"loss": 0.0, "grad_norm": 0.4125}, trained_tokens=20, masked_stale_tokens=4))
    assert line.endswith("| grad 0.412 trained 20 tok masked 4 step 1.2s") and "loss" not in line
    assert "grad n/a trained 24 tok" in format_step_line(_record())  # a trainer that reports no norm
    line = format_step_line(_record(train_time_s=None, train={}))
    assert line.endswith("| rollout only, step 1.2s") and "grad" not in line and "nan" not in line


_SUMMARY = dict(
    eval_accuracy_before=0.25, eval_accuracy_after=0.5, aborted_samples=3, resumed_samples=2, failed_samples=0
)


def test_the_done_line_of_a_trained_run_names_the_most_versions_in_a_trained_sample():
    line = format_done_line(_SUMMARY | {"max_versions_in_a_trained_sample": 2}, "runs/x")
    assert (
        line
        == "done: eval accuracy 0.250 -> 0.500; aborted 3, resumed 2, max versions in a trained sample 2; run dir runs/x"
    )


def test_the_done_line_of_a_rollout_only_run_claims_nothing_trained_and_counts_failed_samples():
    summary = _SUMMARY | {"eval_accuracy_before": None, "eval_accuracy_after": None, "failed_samples": 4}
    line = format_done_line(summary | {"max_versions_in_a_trained_sample": None}, "runs/x")
    assert line == (
        "done: eval accuracy n/a (no eval set) -> n/a (no eval set); aborted 3, resumed 2, failed 4, "
        "nothing trained (rollout only); run dir runs/x"
    )


@pytest.mark.parametrize("reward_fails", [False, True])
async def test_a_rollout_only_run_without_an_eval_set_prints_no_loss_no_nan_accuracy_and_its_failed_samples(
    tmp_path, monkeypatch, capsys, caplog, reward_fails
):
    run_on_a_recording_fake_pool(monkeypatch, assemble)

    async def reward(sample):
        if reward_fails:
            raise ValueError("this reward always raises")
        return 1.0

    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "w5 w6", "label": "x"}) + "\n")
    config = Config(
        data=DataConfig(prompt_data=str(prompts)),
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=4),
        loop=LoopConfig(rollout_batch_size=1, over_sampling_batch_size=1, num_rollout=2),
        train=TrainConfig(global_batch_size=2, micro_batch_size=2),
        engine=EngineConfig(hf_checkpoint=str(model)),
        debug=DebugConfig(debug_rollout_only=True),
        run_dir=str(tmp_path / "run"),
    )
    caplog.set_level(logging.INFO, logger="slime.loop.rl_mode")
    if reward_fails:  # the run goes on to the end (FAILED samples are kept), then says it produced nothing
        with pytest.raises(RunError, match="every one of the 4 samples"):
            await run_training(config, reward_fn=reward, progress=False)
    else:
        await run_training(config, reward_fn=reward, progress=False)
    assert "eval before RL: n/a (no eval set)" in caplog.messages and "accuracy nan" not in caplog.text
    steps = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all(s.endswith("s") and "| rollout only, step " in s and "loss" not in s for s in steps)
    assert all(("failed 2/2 " in s) == reward_fails for s in steps)  # from step 1 on
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["max_versions_in_a_trained_sample"] is None and summary["failed_samples"] == (
        4 if reward_fails else 0
    )
    assert "nothing trained (rollout only)" in format_done_line(summary, config.run_dir)
