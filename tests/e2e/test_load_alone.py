"""``slime train --load RUN_DIR`` alone continues the saved run as it was (issue 31 item 1): the same config, the same
eval set and the same next-step metrics as the run that was not interrupted. The flag rules on resume (what may
change, what is an error) without engines: tests/test_resume_flags.py."""

from __future__ import annotations

import json
import shutil

import pytest

from slime.cli import main
from tests.fixtures.tiny_model import write_tiny_llama

TIMING = ("time_s", "step_time_s", "tokens_per_s", "rollout_wait_s", "train_time_s", "weight_sync_s", "eval_time_s")


NOISY = "train/train_rollout_logprob_abs_diff"
"""Metrics that measure float noise between two processes (engine and trainer): compared within a tolerance."""


def _exact(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(NOISY)}


def _rows(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING and not k.endswith("_time_s")} for r in rows]


def test_load_alone_gives_the_same_config_eval_set_and_next_step_metrics_as_an_uninterrupted_run(tmp_path, capsys):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    train, heldout = tmp_path / "mine.jsonl", tmp_path / "heldout.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) + "\n" for i in range(32)))
    heldout.write_text("".join(json.dumps({"prompt": f"w{4 + i % 9} w9"}) + "\n" for i in range(6)))
    flags = ["--hf-checkpoint", str(model), "--prompt-data", str(train), "--eval-prompt-data", str(heldout)]
    flags += ["--custom-rm-path", "tests.e2e.test_final_model.odd_letters", "--rollout-mode", "sync"]
    flags += ["--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8"]
    flags += ["--global-batch-size", "8", "--lr", "1e-2", "--num-rollout", "2", "--save-interval", "1"]
    flags += ["--num-eval-prompts", "6", "--rollout-shuffle", "--no-progress", "--log-level", "WARNING"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["train", *flags, "--save", str(whole)]) == 0, capsys.readouterr().err
    # the same run stopped after its step-1 checkpoint: its folder as it was then (the later files are cut back)
    shutil.copytree(whole, cut)
    (cut / "checkpoints" / "latest").write_text("step_000001")
    capsys.readouterr()
    assert main(["train", "--load", str(cut), "--no-progress", "--log-level", "WARNING"]) == 0, capsys.readouterr().err
    assert "run dir " + str(cut) in capsys.readouterr().out
    saved, resumed = (json.loads((run / "config.json").read_text()) for run in (whole, cut))
    assert {**resumed, "run_dir": None, "load": None} == {**saved, "run_dir": None, "load": None}
    assert resumed["data"]["eval_prompt_data"] == [str(heldout)] and resumed["loop"]["rollout_batch_size"] == 2
    # step 2 (and the final eval, on the held-out file) as the uninterrupted run's; the trainer/engine logprob gap
    # is float noise (~1e-7) that depends on how the engine batched the requests, so it is compared within 1e-5
    resumed_rows, whole_rows = _rows(cut), _rows(whole)
    assert [_exact(r) for r in resumed_rows] == [_exact(r) for r in whole_rows]
    for a, b in zip(resumed_rows, whole_rows):
        assert {k: v for k, v in a.items() if k.startswith(NOISY)} == pytest.approx(
            {k: v for k, v in b.items() if k.startswith(NOISY)}, abs=1e-5
        )
    ends = [json.loads((run / "summary.json").read_text()) for run in (whole, cut)]
    for key in ("eval_accuracy_before", "eval_accuracy_after", "final_policy_version", "groups_trained"):
        assert ends[0][key] == ends[1][key], key
