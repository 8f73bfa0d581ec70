"""The whole main job with every observer on: trace, /metrics scraped mid-run, TensorBoard, PNGs, report.

Marked slow (an embedded engine subprocess and a torch trainer, ~8 s): run with ``-m slow``.
"""

from __future__ import annotations

import json
import socket

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slime.config import Config, DataConfig, EngineConfig, LoopConfig, ObsConfig, RolloutConfig, TrainConfig
from slime.loop.driver import run_training
from slime.obs.plots import PLOTS
from slime.obs.report import main as report_main
from tests.fixtures.tiny_model import write_tiny_llama
from tests.obs.test_trace import check_nesting, load_valid


@pytest.mark.slow
async def test_a_run_with_every_observer_leaves_trace_metrics_events_plots_and_a_report(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scraped: list[str] = []

    async def reward(sample):
        if not scraped and sample.group_id >= 0:  # a training sample: /metrics answers while the run goes on
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                scraped.append(await resp.text())
        return float("w7" in sample.response.split())

    model = write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{3 + i % 20} w9"}) + "\n" for i in range(32)))
    run = tmp_path / "run"
    config = Config(
        data=DataConfig(prompt_data=str(prompts), eval_prompt_data=str(prompts), num_eval_prompts=4),
        rollout=RolloutConfig(n_samples_per_prompt=4, rollout_max_response_len=16, request_timeout_s=60),
        loop=LoopConfig(mode="april", rollout_batch_size=2, over_sampling_batch_size=4, num_rollout=2),
        train=TrainConfig(lr=1e-3, global_batch_size=8, micro_batch_size=8),
        engine=EngineConfig(hf_checkpoint=str(model), startup_timeout_s=60),
        obs=ObsConfig(enable_trace=True, metrics_port=port, metrics_host="127.0.0.1", use_tensorboard=True),
        run_dir=str(run),
    )
    await run_training(config, reward_fn=reward, progress=False)
    names = {f.name for f in text_string_to_metric_families(scraped[0])}
    assert {"slime_requests_in_flight", "slime_engine_requests_in_flight", "slime_partial_groups_queued"} <= names
    events = load_valid(run / "trace.json")
    check_nesting(events)
    counts = {
        n: sum(e["name"] == n for e in events)
        for n in ("generate", "reward", "train_step", "weight_sync", "eval", "step")
    }
    assert counts["generate"] >= 16 and counts["reward"] >= 16 and counts["eval"] == 2
    assert counts["train_step"] == counts["weight_sync"] == counts["step"] == 2
    assert any(p.name.startswith("events.out.tfevents") for p in (run / "tb").iterdir())
    assert all((run / name).stat().st_size > 1000 for name in PLOTS)
    capsys.readouterr()  # the run's step lines
    assert report_main([str(run), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (
        rep["status"] == "finished" and rep["steps"] == 2 and rep["final_policy_version"] == 2 and rep["problems"] == []
    )
