"""Engines that stop answering end the run clearly, in bounded time, and leave nothing behind (issue 26, item 4).

The external engine is the embedded engine served in this process (``EngineServer``) behind a
``FaultyProxy``: a real HTTP server that forwards until told to stall (accept, never answer: a wedged
engine) or to die (stop listening: its process is gone). Health checks run every 0.5 s, so "a few
health-check intervals" is seconds; each run is bounded by ``asyncio.timeout`` well below what the
code before this change waited (the 120 s startup timeout plus the control timeout).

The last test runs ``slime train`` with an embedded engine as a subprocess, kills it with SIGKILL
(no ``finally`` runs) and checks that the engine process is gone within seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime.config import Config, DataConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.errors import SlimeError, first_slime_error
from slime.loop.driver import run_training
from slime.servers.embedded import EngineServer
from tests.e2e.engine_faults import FaultyProxy
from tests.fixtures.tiny_model import write_tiny_llama

REPO = str(Path(__file__).resolve().parents[2])
BOUND_S = 30.0
"""Each run below must end within this; before the change a run without engines waited 121 s."""


async def answered(sample) -> float:
    """Reward 1.0 for any response the engine generated: a sample the engines did not serve would score 0."""
    return 1.0 if sample.response_ids else 0.0


def _config(tmp_path: Path, model: Path, urls: list[str], *, max_retries: int = 1) -> Config:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(16)) + "\n")
    return Config(
        data=DataConfig(prompt_data=str(prompts), eval_prompt_data=str(prompts), num_eval_prompts=4),
        rollout=RolloutConfig(
            n_samples_per_prompt=2,
            rollout_max_response_len=8,
            request_timeout_s=1.0,
            control_timeout_s=0.5,
            max_retries=max_retries,
            retry_backoff_s=0.05,
        ),
        loop=LoopConfig(mode="sync", rollout_batch_size=2, num_rollout=2),
        train=TrainConfig(lr=1e-3, global_batch_size=4, micro_batch_size=4),
        engine=EngineConfig(
            hf_checkpoint=str(model),
            rollout_external_engine_addrs=tuple(urls),
            health_check_interval_s=0.5,
            health_check_timeout_s=0.5,
            circuit_breaker_threshold=2,
            circuit_breaker_cooldown_s=0.5,
        ),
        run_dir=str(tmp_path / "run"),
    )


async def _run_until_it_fails(config: Config) -> SlimeError:
    """Run ``config`` (bounded by ``BOUND_S``); the slime error it ends with, as ``slime train`` prints it."""
    with pytest.raises(BaseException) as info:
        async with asyncio.timeout(BOUND_S):  # before the change: TimeoutError here (the run waited 121 s in silence)
            await run_training(config, reward_fn=answered, progress=False)
    error = first_slime_error(info.value) if isinstance(info.value, BaseExceptionGroup) else info.value
    assert isinstance(error, SlimeError), f"the run ended with {info.value!r}, not a slime error"
    return error


def _records(tmp_path: Path) -> list[dict]:
    path = tmp_path / "run" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_hung_external_engine_ends_the_run_in_a_few_health_checks_with_one_line_naming_it(tmp_path):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    async with EngineServer(model, port=0, seed=0, weight_version="0") as server, FaultyProxy(server.url) as proxy:
        proxy.fail_at("stall", n=0, path="/generate")  # wedged from the eval's first request on
        t0 = time.monotonic()
        error = await _run_until_it_fails(_config(tmp_path, model, [proxy.url]))
    message = str(error)
    assert type(error).__name__ == "EnginesGone" and "\n" not in message, message
    assert message.startswith("no engine left to serve /generate") and f"engine {proxy.url}: " in message
    assert "no answer to /health_generate within 0.5s" in message, message  # it left rotation by its health checks
    assert time.monotonic() - t0 < BOUND_S
    assert not [r for r in _records(tmp_path) if r["kind"] == "eval"], "the timeouts were scored as an eval"


async def test_a_killed_external_engine_is_named_dead_not_as_a_failed_weight_update(tmp_path):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    async with EngineServer(model, port=0, seed=0, weight_version="0") as server, FaultyProxy(server.url) as proxy:
        proxy.fail_at(
            "kill", n=1, path="/update_weights_from_disk"
        )  # n=0 is the run's initial weights; 1: step 1's sync
        error = await _run_until_it_fails(_config(tmp_path, model, [proxy.url]))
    message = str(error)
    assert type(error).__name__ == "EnginesGone" and "\n" not in message, message
    assert f"engine {proxy.url}: dead (connection refused: nothing listens there)" in message, message
    assert "update_weights" not in message and "weight update" not in message
    assert [r["step"] for r in _records(tmp_path) if r["kind"] == "step"] == [
        1
    ]  # step 1 trained; step 2 found no engine


@pytest.mark.parametrize("max_retries", [1, 0])
async def test_the_eval_never_scores_requests_the_engines_did_not_answer_as_wrong_answers(tmp_path, max_retries):
    """Two addresses of one engine; the first stalls from the eval's first request on. With a retry
    every sample is served by the other (accuracy 1.0); without, the unanswered ones are not scored
    and the eval says how many (before the change: scored 0, accuracy below 1.0)."""
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    async with (
        EngineServer(model, port=0, seed=0, weight_version="0") as server,
        FaultyProxy(server.url) as hung,
        FaultyProxy(server.url) as good,
    ):
        hung.fail_at("stall", n=0, path="/generate")
        async with asyncio.timeout(BOUND_S):
            await run_training(
                _config(tmp_path, model, [hung.url, good.url], max_retries=max_retries),
                reward_fn=answered,
                progress=False,
            )
    before = next(r for r in _records(tmp_path) if r["kind"] == "eval" and r["step"] == 0)
    assert hung.num_requests["/generate"] >= 1  # the eval did send requests to the hung address
    assert before["accuracy"] == 1.0, before  # every scored sample was answered
    if max_retries:
        assert before["failed"] == 0 and before["engine_failures"] == 0
    else:
        assert before["failed"] == before["engine_failures"] >= 1


def _alive(pid: int) -> bool:
    """Running (a zombie, waiting for its reaper, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _embedded_engines_of(pid: int) -> list[int]:
    """The pids of the embedded engine processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if (
            entry.name.isdigit()
            and int(stat.rsplit(")", 1)[1].split()[1]) == pid
            and b"slime.servers.embedded.server" in cmdline
        ):
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_kill_9_of_slime_train_takes_its_embedded_engine_with_it(tmp_path):
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w9", "label": "1"}) for i in range(16)) + "\n")
    argv = ["train", "--hf-checkpoint", str(model), "--prompt-data", str(prompts), "--save", str(tmp_path / "run")]
    argv += [
        "--num-rollout",
        "1000",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "4",
    ]
    argv += ["--micro-batch-size", "4", "--rollout-max-response-len", "4", "--skip-eval-before-train", "--no-progress"]
    argv += ["--custom-rm-path", "tests.e2e.test_unanswered_engines.answered"]
    env = {**os.environ, "PYTHONPATH": REPO}
    driver = subprocess.Popen([sys.executable, "-m", "slime.cli", *argv], env=env, cwd=REPO, stderr=subprocess.DEVNULL)
    engines: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while not (engines := _embedded_engines_of(driver.pid)) or not (tmp_path / "run" / "metrics.jsonl").exists():
            assert driver.poll() is None and time.monotonic() < deadline, "slime train did not reach its first step"
            time.sleep(0.2)
        os.kill(driver.pid, signal.SIGKILL)  # no finally, no atexit: only the kernel can stop the engine now
        driver.wait(10)
        deadline = time.monotonic() + 10
        while any(map(_alive, engines)) and time.monotonic() < deadline:
            time.sleep(0.1)
        orphans = [pid for pid in engines if _alive(pid)]
        assert not orphans, f"embedded engine {orphans} outlived the killed slime train (orphaned to init)"
    finally:
        driver.kill()
        for pid in engines:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
