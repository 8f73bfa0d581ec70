"""Launch mode end to end on a CPU: ``slime train --rollout-num-gpus 1`` starts ``python -m
sglang.launch_server`` itself, trains through it and stops it.

``sglang`` here is a stand-in package put on ``PYTHONPATH`` (``LAUNCH_SERVER``): it records its
command line and environment, spawns a child (as SGLang spawns its scheduler and detokenizer), then
execs the embedded engine on the port it was given, so the run talks to a real HTTP server that
the plan started. A stand-in ``torch_memory_saver`` lets ``--colocate`` pass the up-front check.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import slime
from slime.cli import main
from tests.fixtures.tiny_model import write_tiny_llama

LAUNCH_SERVER = """
import argparse, json, os, subprocess, sys
p = argparse.ArgumentParser()
for flag in ("--model-path", "--host", "--port", "--weight-version"):
    p.add_argument(flag)
args, _ = p.parse_known_args()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # SGLang's scheduler, say
keys = ("CUDA_VISIBLE_DEVICES", "PYTHONPATH", "RANK", "MASTER_PORT", "NCCL_NVLS_ENABLE")
record = {"argv": sys.argv[1:], "pid": os.getpid(), "child_pid": child.pid, "env": {k: os.environ.get(k) for k in keys}}
with open(os.path.join(os.environ["FAKE_SGLANG_RECORDS"], f"{os.getpid()}.json"), "w") as f:
    json.dump(record, f)
os.execv(sys.executable, [sys.executable, "-m", "slime.servers.embedded.server", "--model", args.model_path, "--host", args.host,
                          "--port", args.port, "--weight-version", args.weight_version])
"""
REPO = str(Path(slime.__file__).resolve().parents[1])


def _fake_site(tmp_path: Path, *, memory_saver: bool) -> Path:
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(LAUNCH_SERVER)
    if memory_saver:
        (site / "torch_memory_saver").mkdir()
        (site / "torch_memory_saver" / "__init__.py").write_text("")
    return site


def _alive(pid: int) -> bool:
    """Running (a zombie, waiting for its reaper, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _argv(tmp_path: Path, model: Path, *extra: str) -> list[str]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(16)) + "\n")
    return [
        "train",
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(prompts),
        "--rollout-num-gpus",
        "1",
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "4",
        "--micro-batch-size",
        "4",
        "--rollout-max-response-len",
        "8",
        "--custom-rm-path",
        "tests.e2e.test_record_replay.parity",
        "--engine-startup-timeout-s",
        "60",
        "--health-check-interval-s",
        "0",
        "--save",
        str(tmp_path / "run"),
        "--no-progress",
        "--sglang-attention-backend",
        "triton",
        *extra,
    ]


def test_slime_train_launches_sglang_servers_trains_through_them_and_stops_their_process_group(tmp_path, monkeypatch):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    site = _fake_site(tmp_path, memory_saver=True)
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.syspath_prepend(str(site))  # our own up-front check (find_spec) sees what the child will import
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), REPO]))
    monkeypatch.setenv("FAKE_SGLANG_RECORDS", str(records))
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("MASTER_PORT", "29999")  # as the megatron trainer leaves it: not the server's
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main(_argv(tmp_path, model, "--colocate")) == 0

    (record,) = [json.loads(p.read_text()) for p in records.iterdir()]
    argv = record["argv"]
    assert argv[argv.index("--weight-version") + 1] == "0" and argv[argv.index("--model-path") + 1] == str(model)
    assert (
        argv[argv.index("--mem-fraction-static") + 1] == "0.5" and "--enable-memory-saver" in argv
    )  # colocated defaults
    assert argv[argv.index("--attention-backend") + 1] == "triton"  # --sglang-* passed through
    assert record["env"] == {
        "CUDA_VISIBLE_DEVICES": "0",
        "PYTHONPATH": os.pathsep.join([str(site), REPO]),
        "RANK": None,
        "MASTER_PORT": None,
        "NCCL_NVLS_ENABLE": "0",
    }
    assert not _alive(record["pid"]) and not _alive(record["child_pid"]), (
        "a process of the server's group outlived the run"
    )

    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_policy_version"] == 2 and summary["groups_trained"] == 4
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    steps = [r for r in steps if r["kind"] == "step"]
    assert [r["policy_version"] for r in steps] == [1, 2]
    assert steps[0]["train/train_rollout_logprob_abs_diff"] < 1e-3  # the launched server serves the trainer's weights
    assert (run / "logs" / "actor-0.log").exists()  # the server's output, and no router (one server)
    assert not (run / "logs" / "router-actor.log").exists()


@pytest.mark.parametrize("missing", ["sglang", "torch_memory_saver"])
def test_a_package_the_launched_servers_need_is_one_error_before_anything_starts(
    tmp_path, monkeypatch, capsys, missing
):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    if missing != "sglang":
        monkeypatch.syspath_prepend(str(_fake_site(tmp_path, memory_saver=False)))
    assert main(_argv(tmp_path, model, "--colocate")) == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("slime train: error")]
    assert f"cannot import {missing}:" in err and "pip install" in err
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


def test_sigterm_to_slime_train_stops_the_servers_it_launched(tmp_path):
    """``timeout`` / ``kill`` signal slime's process (group); the servers run in their own sessions."""
    import signal
    import subprocess
    import sys
    import time

    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    site = _fake_site(tmp_path, memory_saver=False)
    records = tmp_path / "records"
    records.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), REPO]), "FAKE_SGLANG_RECORDS": str(records)}
    argv = _argv(tmp_path, model, "--num-rollout", "1000")
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime.cli", *argv], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not reach its first step"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    (record,) = [json.loads(p.read_text()) for p in records.iterdir()]
    assert proc.returncode == 130 and "interrupted" in err
    assert not _alive(record["pid"]) and not _alive(record["child_pid"])
