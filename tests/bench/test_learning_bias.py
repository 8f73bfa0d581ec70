"""Issue 30: ``slime bench learning`` and ``slime report`` carry the masked share and the length bias of each run."""

import pytest

from slime.bench import learning
from slime.obs.report import format_report, summarize


def _records():
    recs = [
        {"kind": "eval", "step": s, "accuracy": a, "time_s": t, "eval_time_s": 1.0}
        for s, a, t in [(0, 0.5, 2.0), (2, 0.6, 9.0)]
    ]
    recs += [
        {
            "kind": "step",
            "step": 1,
            "trained_tokens": 90,
            "lag_histogram": {"0": 90},
            "masked_stale_tokens": 10,
            "fully_masked_samples": 1,
            "bias/len_ratio": 0.8,
            "bias/long_share": 0.1,
            "bias/age_long": 2.0,
        },
        {
            "kind": "step",
            "step": 2,
            "trained_tokens": 100,
            "lag_histogram": {"1": 100},
            "masked_stale_tokens": 0,
            "bias/len_ratio": 0.6,
            "bias/long_share": 0.3,
            "bias/age_long": None,
        },  # a NaN written as null
    ]
    return sorted(recs, key=lambda r: (r["step"], r["kind"] == "eval"))


def test_a_runs_curve_and_the_table_carry_the_bias_and_the_masked_share():
    c = learning.run_curve(_records(), target=0.9)
    assert c["masked_token_share"] == pytest.approx(10 / 200) and c["fully_masked_samples"] == 1
    assert c["bias"] == pytest.approx({"len_ratio": 0.7, "long_share": 0.2, "age_long": 2.0})
    summary = learning.summarize({"april": [{"seed": 0, **c}, {"seed": 1, **c, "bias": {"len_ratio": 0.9}}]})
    assert summary["april"]["bias"]["len_ratio"] == pytest.approx(0.8)
    row = learning.format_table(summary, 0.9).splitlines()[2]
    assert " 0.050 " in row and " 0.80 " in row and "0.20/-" in row


def test_the_report_has_the_length_bias_line(tmp_path):
    rep = summarize({"loop": {"mode": "april"}}, _records(), None, [])
    assert rep["staleness"]["bias"]["len_ratio"] == pytest.approx(0.7) and rep["staleness"]["fully_masked_samples"] == 1
    line = next(ln for ln in format_report(tmp_path, rep).splitlines() if "length bias" in ln)
    assert "len_ratio 0.700" in line and "age_long 2.000" in line and "fully masked samples 1" in line


def test_merge_can_time_another_target_from_the_runs_metrics(tmp_path):
    import json

    run_dir = tmp_path / "runs" / "sync-s0"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    curve = {"seed": 0, **learning.run_curve(_records(), target=0.9)}
    assert curve["time_to_target_s"] is None
    part = {"task": "chain", "target_accuracy": 0.9, "num_rollout": 2, "eval_interval": 2, "extra_flags": []}
    part |= {"curves": {"sync": [curve]}, "argv": {"sync": [["--save", str(run_dir)]]}}
    (tmp_path / "a.json").write_text(json.dumps(part))
    merged = learning.merge_results([tmp_path / "a.json"], retarget=0.55)
    assert merged["target_accuracy"] == 0.55 and merged["curves"]["sync"][0]["time_to_target_s"] == 6.0
    with pytest.raises(ValueError, match="no metrics.jsonl"):
        (run_dir / "metrics.jsonl").unlink()
        learning.merge_results([tmp_path / "a.json"], retarget=0.55)


def _run(lengths_rewards: list[tuple[int, int, float]]):
    """A run of steps (samples, mean response length, reward) and its curve."""
    recs = [{"kind": "eval", "step": 0, "accuracy": 0.5, "time_s": 1.0}]
    for step, (n, length, reward) in enumerate(lengths_rewards, start=1):
        recs.append(
            {
                "kind": "step",
                "step": step,
                "num_samples": n,
                "response_tokens": n * length,
                "reward_mean": reward,
                "trained_tokens": n * length,
                "lag_histogram": {"0": n * length},
                "trained_samples": n,
                "trained_sample_response_tokens": n * length,
                "trained_sample_reward_sum": n * reward,
            }
        )
    recs.append({"kind": "eval", "step": len(lengths_rewards), "accuracy": 0.5, "time_s": 9.0})
    return learning.run_curve(recs, target=0.9)


def test_the_table_sets_each_modes_trained_length_and_reward_beside_syncs():
    # what the H200's long tail showed: APRIL's first steps train the short, easy answers (20 tokens, reward
    # 0.87) while sync trains what is drawn; the window ratio len_ratio is 1.00 in both (APRIL's completed
    # draws are as short as what it trains), only the side-by-side ratio shows it
    sync = _run([(64, 250, 0.5), (64, 250, 0.5)])
    april = _run([(64, 20, 0.9), (64, 230, 0.5)])
    assert april["trained_len_mean"] == pytest.approx(125) and april["trained_reward_mean"] == pytest.approx(0.7)
    summary = learning.summarize({"sync": [{"seed": 0, **sync}], "april": [{"seed": 0, **april}]})
    assert summary["april"]["trained_len_vs_sync"] == pytest.approx(0.5)
    assert summary["april"]["trained_reward_vs_sync"] == pytest.approx(1.4)
    rows = learning.format_table(summary, 0.9).splitlines()
    assert "len/rew vs sync" in rows[0] and rows[2].endswith("1.00/1.00") and rows[3].endswith("0.50/1.40")


def test_failed_samples_and_a_run_without_sync_leave_the_side_by_side_ratio_out():
    c = _run([(4, 10, 1.0)])
    steps = [
        {
            "kind": "step",
            "step": 1,
            "num_samples": 2,
            "failed_samples_in_batch": 2,
            "response_tokens": 0,
            "reward_mean": None,
            "trained_tokens": 0,
            "trained_samples": 0,
        }
    ]
    none = learning.run_curve([{"kind": "eval", "step": 0, "accuracy": 0.5, "time_s": 1.0}, *steps], target=0.9)
    assert none["trained_len_mean"] is None and none["trained_reward_mean"] is None
    summary = learning.summarize({"april": [{"seed": 0, **c}]})
    assert summary["april"]["trained_len_vs_sync"] is None
    assert learning.format_table(summary, 0.9).splitlines()[2].endswith("-/-")


def _sample(num_tokens: int, version: int, reward: float):
    from slime.types import Sample, Status

    s = Sample(prompt_ids=[1, 2], status=Status.COMPLETED, reward=reward)
    s.append([5] * num_tokens, [0.0] * num_tokens, version)
    return s


def _loop_row(groups, trainer_version: int, max_staleness: int, step: int) -> dict:
    """A metrics.jsonl step row as the loop builds it (apply_staleness, then the batch, into a StepRecord)."""
    from slime.loop.offpolicy import apply_staleness
    from slime.loop.step import batch_stats
    from slime.step_record import StepRecord

    stale = apply_staleness(groups, trainer_version=trainer_version, max_staleness=max_staleness)
    return StepRecord(**batch_stats(groups), **stale, step=step).to_dict()


def test_a_fully_masked_sample_is_out_of_the_per_trained_sample_length_and_reward():
    from slime.types import Group

    # trainer at version 4, --max-staleness 1: a fresh 10-token answer (reward 1) trains, a 90-token one
    # from version 1 is masked whole; the batch's own means count both (50 tokens, reward 0.5)
    row = _loop_row([Group(group_id=0, samples=[_sample(10, 4, 1.0), _sample(90, 1, 0.0)])], 4, 1, step=1)
    assert row["fully_masked_samples"] == 1 and row["response_tokens"] == 100
    curve = learning.run_curve([{"kind": "eval", "step": 0, "accuracy": 0.5, "time_s": 1.0}, row], target=0.9)
    assert curve["trained_len_mean"] == pytest.approx(10) and curve["trained_reward_mean"] == pytest.approx(1.0)


def test_the_reports_off_policy_share_is_of_the_runs_trained_tokens(tmp_path):
    from slime.types import Group

    # step 1 trains nothing (all masked: no share, not 0); step 2 trains 20 tokens, all one version behind
    masked = _loop_row([Group(group_id=1, samples=[_sample(20, 0, 0.0)])], 5, 1, step=1)
    lagged = _loop_row([Group(group_id=2, samples=[_sample(20, 5, 0.0)])], 6, 1, step=2)
    assert masked["off_policy_token_fraction"] != masked["off_policy_token_fraction"]  # NaN
    rep = summarize({"loop": {"mode": "async"}}, [masked, lagged], None, [])
    assert rep["staleness"]["off_policy_token_fraction"] == pytest.approx(1.0)
    assert "off-policy token share 1.000" in format_report(tmp_path, rep)
