"""Record a run's rollouts, replay them in a train-only run with no engine, and ``slime rollout``.

The engines are the embedded engine served in this process (``EngineServer``, given as an external
engine), which starts in well under a second; ``slime train`` would launch the same server as a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading

import pytest

from slime.config import Config, DataConfig, DebugConfig, EngineConfig, LoopConfig, RolloutConfig, TrainConfig
from slime.loop import assemble
from slime.loop.driver import run_training
from slime.loop.record import load_rollout_record
from slime.servers.embedded import EngineServer
from slime.types import OFFLINE_VERSION
from tests.fixtures.tiny_model import write_tiny_llama


async def parity(sample):
    """A reward that differs within groups, so GRPO has a non-zero loss to compare."""
    return float(sum(sample.response_ids) % 2)


def _prompts(tmp_path):
    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(json.dumps({"prompt": f"w{3 + i % 20} w{5 + i % 7} w9"}) for i in range(16)) + "\n")
    return p


def _offline(tmp_path):
    """Two pre-generated groups without logprobs (the trainer computes them)."""
    p = tmp_path / "offline.jsonl"
    rows = [
        {"prompt": f"w{3 + i} w9", "response": r, "reward": float(j)}
        for i in range(2)
        for j, r in enumerate(["w7 w7 <eos>", "w8"])
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(p)


def _config(tmp_path, model, run, debug, engine_url=None, offline=None):
    return Config(
        data=DataConfig(prompt_data=str(_prompts(tmp_path)), offline_data=offline),
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=8, request_timeout_s=60),
        loop=LoopConfig(
            mode="april",
            rollout_batch_size=2,
            over_sampling_batch_size=4,
            num_rollout=2,
            max_staleness=2,
            offline_ratio=0.5 if offline else 0.0,
        ),
        train=TrainConfig(lr=1e-3, global_batch_size=4, micro_batch_size=4),
        engine=EngineConfig(
            hf_checkpoint=str(model), rollout_external_engine_addrs=(engine_url,) if engine_url else ()
        ),
        debug=debug,
        run_dir=str(tmp_path / run),
    )


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_train_only_run_on_recorded_groups_trains_the_same_groups_without_an_engine(tmp_path, monkeypatch):
    """The recording run mixes in offline groups (half of each batch): they are recorded and replayed too."""
    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    template = str(tmp_path / "records" / "rollout_{rollout_id}.msgpack")
    async with EngineServer(model, port=0, seed=0, weight_version="0") as server:
        config = _config(
            tmp_path,
            model,
            "run",
            DebugConfig(save_debug_rollout_data=template),
            server.url,
            offline=_offline(tmp_path),
        )
        await run_training(config, reward_fn=parity, progress=False)
    for step in (1, 2):
        rec = load_rollout_record(template, step)
        assert rec.policy_version == step - 1 and len(rec.groups) == 2
        assert [all(v == OFFLINE_VERSION for s in g.samples for v in s.versions) for g in rec.groups] == [True, False]
        assert all(
            len(s.response_ids) == len(s.versions) == len(s.loss_mask) and s.reward is not None
            for g in rec.groups
            for s in g.samples
        )

    def no_engines(*args, **kwargs):
        raise AssertionError("a train-only run launched an engine")

    monkeypatch.setattr(assemble, "start_rollout", no_engines)
    summary = await run_training(
        _config(tmp_path, model, "replay", DebugConfig(load_debug_rollout_data=template)),
        reward_fn=parity,
        progress=False,
    )
    assert summary["final_policy_version"] == 2 and summary["groups_trained"] == 4
    ids = lambda rows: [(r["step"], r["group_id"]) for r in rows]  # noqa: E731
    assert ids(_lines(tmp_path / "replay" / "trained_groups.jsonl")) == ids(
        _lines(tmp_path / "run" / "trained_groups.jsonl")
    )
    steps = [
        [r for r in _lines(tmp_path / name / "metrics.jsonl") if r["kind"] == "step"] for name in ("run", "replay")
    ]
    assert any(r["train/grad_norm"] > 0 for r in steps[0]), "no step had a gradient to compare"
    for orig, replay in zip(*steps, strict=True):
        for key in ("train/loss", "train/grad_norm", "reward_mean", "trained_tokens", "max_version_lag"):
            assert replay[key] == pytest.approx(orig[key], rel=1e-4, abs=1e-7), key


@contextlib.contextmanager
def _engine_in_thread(model):
    """An ``EngineServer`` on its own event loop in a thread (``slime rollout`` runs its own loop)."""
    started, holder = threading.Event(), {}

    async def serve():
        holder["stop"] = asyncio.Event()
        async with EngineServer(model, port=0, seed=0, weight_version="0") as server:
            holder["url"], holder["loop"] = server.url, asyncio.get_running_loop()
            started.set()
            await holder["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(60), "engine did not start"
    try:
        yield holder["url"]
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(30)


def test_slime_rollout_writes_records_and_leaves_the_weights_unchanged(tmp_path):
    from slime.cli import main

    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    digest = lambda: {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model.iterdir())}  # noqa: E731
    before = digest()
    template = str(tmp_path / "records" / "rollout_{rollout_id}.msgpack")
    with _engine_in_thread(model) as url:
        argv = [
            "rollout",
            "--hf-checkpoint",
            str(model),
            "--rollout-external-engine-addrs",
            url,
            "--prompt-data",
            str(_prompts(tmp_path)),
            "--save",
            str(tmp_path / "run"),
            "--save-debug-rollout-data",
            template,
            "--num-rollout",
            "2",
            "--rollout-batch-size",
            "2",
            "--over-sampling-batch-size",
            "4",
            "--partial-rollout",
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
            "--no-progress",
        ]
        assert main(argv) == 0
    records = [load_rollout_record(template, step) for step in (1, 2)]
    assert [r.policy_version for r in records] == [0, 0] and sum(len(r.groups) for r in records) == 4
    assert all(v == 0 for r in records for g in r.groups for s in g.samples for v in s.versions)
    assert all(s.reward is not None for r in records for g in r.groups for s in g.samples)
    assert digest() == before and not (tmp_path / "run" / "weights").exists()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_policy_version"] == 0 and summary["groups_trained"] == 4
