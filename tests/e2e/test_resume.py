"""Checkpoint and resume: a run stopped after a checkpoint and resumed trains exactly the groups an
uninterrupted run trains (sync mode is deterministic), with partial rollouts carried over (april); two
runs on one run folder at once (one is refused), and a full disk during a disk weight sync (one line).
The SFT runs of tests/e2e/test_run_folder_lock.py and tests/loop/test_checkpoint_errors.py cover the
lock across processes, damaged checkpoints and a full disk during a checkpoint."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import msgspec
import pytest

from slime.cli import main
from slime.cli.preflight import check_run_dir
from slime.config import Config, DataConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import ConfigError
from slime.loop.checkpoint import latest_checkpoint
from slime.loop.driver import run_training
from tests.e2e.test_main_job import count_w7
from tests.fixtures.sft_run import small_disk
from tests.fixtures.tiny_model import write_tiny_llama


def _config(tmp_path, mode, num_rollout, run):
    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        prompts.write_text(
            "\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(64)) + "\n"
        )
    model = tmp_path / "model"
    if not model.exists():
        write_tiny_llama(model, seed=0, with_tokenizer=True)
    return Config(
        data=DataConfig(
            prompt_data=str(prompts), eval_prompt_data=str(prompts), num_eval_prompts=4, rollout_shuffle=True
        ),
        rollout=RolloutConfig(n_samples_per_prompt=4, rollout_max_response_len=24, request_timeout_s=60),
        loop=LoopConfig(
            mode=mode, rollout_batch_size=4, over_sampling_batch_size=8, num_rollout=num_rollout, max_staleness=3
        ),
        train=TrainConfig(lr=1e-3, global_batch_size=16, micro_batch_size=16),
        engine=EngineConfig(hf_checkpoint=str(model), startup_timeout_s=60),
        run_dir=str(tmp_path / run),
        save_interval=1,
        load=str(tmp_path / run),
    )


def _trained(tmp_path, run):
    return [json.loads(line) for line in (tmp_path / run / "trained_groups.jsonl").read_text().splitlines()]


async def test_resumed_sync_run_trains_the_same_groups_as_an_uninterrupted_one(tmp_path):
    await run_training(_config(tmp_path, "sync", 4, "ref"), reward_fn=count_w7, progress=False)
    await run_training(_config(tmp_path, "sync", 2, "cut"), reward_fn=count_w7, progress=False)
    assert latest_checkpoint(tmp_path / "cut" / "checkpoints").name == "step_000002"
    summary = await run_training(_config(tmp_path, "sync", 4, "cut"), reward_fn=count_w7, progress=False)
    ref, cut = _trained(tmp_path, "ref"), _trained(tmp_path, "cut")
    assert [(r["step"], r["group_id"], r["data_index"]) for r in cut] == [
        (r["step"], r["group_id"], r["data_index"]) for r in ref
    ]
    assert summary["final_policy_version"] == 4 and summary["groups_trained"] == 16
    steps = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1, 2, 3, 4]


async def test_checkpoint_carries_partial_rollouts_and_no_group_is_lost_or_repeated(tmp_path):
    await run_training(_config(tmp_path, "april", 2, "run"), reward_fn=count_w7, progress=False)
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    state = msgspec.json.decode((ckpt / "loop.json").read_bytes())
    pending = {g["group_id"] for g in state["ready"] + state["partial"]}
    assert state["next_group_id"] >= len(state["taken"]) == 8
    await run_training(_config(tmp_path, "april", 4, "run"), reward_fn=count_w7, progress=False)
    trained = [r["group_id"] for r in _trained(tmp_path, "run")]
    assert len(trained) == len(set(trained)) == 16
    final = msgspec.json.decode((latest_checkpoint(tmp_path / "run" / "checkpoints") / "loop.json").read_bytes())
    left = {g["group_id"] for g in final["ready"] + final["partial"]}
    assert set(trained) | left == set(range(final["next_group_id"])), "a group was lost across the resume"
    assert pending <= set(trained) | left


async def test_two_runs_started_at_once_on_one_run_folder_one_is_refused_and_the_other_logs_each_step_once(tmp_path):
    """The issue's two fresh runs at once (both "done", metrics [1,2,3,1,4,2,3,4]): the second is refused
    before it writes anything, naming the first (this process: both run in one event loop here)."""
    config = msgspec.structs.replace(_config(tmp_path, "sync", 3, "run"), load=None)
    done = await asyncio.gather(
        *(run_training(config, reward_fn=count_w7, progress=False) for _ in range(2)), return_exceptions=True
    )
    refused = [d for d in done if isinstance(d, BaseException)]
    assert len(refused) == 1 and isinstance(refused[0], ConfigError), done
    assert "is in use by another live run (pid " in str(refused[0]) and ", this process, started " in str(refused[0])
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == [1, 2, 3]
    trained = _trained(tmp_path, "run")
    assert [r["step"] for r in trained] == sorted(r["step"] for r in trained) and len(
        {r["group_id"] for r in trained}
    ) == len(trained) == 12
    with pytest.raises(ConfigError, match="already holds a run"):  # once it ended, the folder is free (and used)
        check_run_dir(config)


def test_a_full_disk_during_a_disk_weight_sync_ends_the_run_with_one_line(tmp_path, capsys):
    """``--weight-sync disk`` (the default) writes ``RUN_DIR/weights``; on a full disk the run stops at the
    first sync with one line naming ENOSPC and the path, and leaves no engine behind."""
    prompts, model = tmp_path / "prompts.jsonl", write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(32)) + "\n")
    with small_disk(
        tmp_path / "disk", 80 * 1024
    ) as disk:  # the run's small files fit, the weights (about 100 KiB) do not
        argv = [
            "train",
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(prompts),
            "--custom-rm-path",
            "tests.e2e.test_main_job.count_w7",
        ]
        argv += [
            "--n-samples-per-prompt",
            "4",
            "--rollout-max-response-len",
            "16",
            "--rollout-batch-size",
            "2",
            "--num-rollout",
            "2",
        ]
        argv += [
            "--global-batch-size",
            "8",
            "--skip-eval-before-train",
            "--save",
            str(disk / "run"),
            "--no-progress",
            "--log-level",
            "WARNING",
        ]
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(
        "slime train: error: weight sync (--weight-sync disk) of version 1: no space left on device (ENOSPC) writing "
    )
    assert f"{disk / 'run' / 'weights' / 'v1'}: the disk mounted at {disk} (tmpfs)" in err
    left = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split()
    assert left == [], f"processes left behind: {left}"
