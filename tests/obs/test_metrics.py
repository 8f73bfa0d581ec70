"""Prometheus /metrics (scraped and parsed), TensorBoard events (read back), W&B (faked), the observers bundle."""

from __future__ import annotations

import socket
import sys
import types

import aiohttp
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slime.config import Config, LoopConfig, ObsConfig
from slime.errors import ConfigError
from slime.obs.metrics import PrometheusExporter, ScalarLoggers, TensorBoardWriter, scalars_of
from slime.obs.observers import Observers

STEP = {
    "kind": "step",
    "step": 3,
    "policy_version": 3,
    "reward_mean": 0.625,
    "accuracy": 0.5,
    "tokens_per_s": 812.0,
    "step_time_s": 1.5,
    "aborted_samples": 4,
    "resumed_samples": 2,
    "failed_samples": 1,
    "generated_tokens": 1200,
    "filtered_groups": 0,
    "dropped_stale_groups": 0,
    "off_policy_token_fraction": 0.25,
    "max_version_lag": 1,
    "lag_histogram": {"0": 90, "1": 30},
    "train/loss": -0.01,
    "partial_groups_queued": 3,
    "ready_groups_left": 1,
}


class _Client:
    def __init__(self, url, n):
        self.url, self.num_inflight = url, n


class _Pool:
    clients = [_Client("http://127.0.0.1:30000", 5), _Client("http://127.0.0.1:30001", 2)]
    num_inflight = 7


class _Buffer:
    num_partial, num_ready = 6, 2


async def scrape(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as resp:
        assert resp.status == 200 and resp.content_type == "text/plain"
        text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{label}}}" if label else "")] = sample.value
    return out


async def test_metrics_endpoint_serves_step_values_counters_and_live_engine_load():
    async with PrometheusExporter(host="127.0.0.1", port=0) as exp:
        assert exp.port > 0
        exp.watch(pool=_Pool(), buffer=_Buffer())
        exp.observe(STEP)
        exp.observe(dict(STEP, step=4, aborted_samples=6))
        exp.observe({"kind": "eval", "step": 4, "accuracy": 0.75})
        got = await scrape(exp.port)
    assert got["slime_policy_version"] == 3 and got["slime_step"] == 4 and got["slime_reward_mean"] == 0.625
    assert got["slime_tokens_per_second"] == 812.0 and got["slime_eval_accuracy"] == 0.75
    assert (
        got["slime_aborted_samples_total"] == 10
        and got["slime_resumed_samples_total"] == 4
        and got["slime_failed_samples_total"] == 2
    )
    assert (
        got["slime_requests_in_flight"] == 7
        and got["slime_partial_groups_queued"] == 6
        and got["slime_ready_groups"] == 2
    )
    assert got["slime_engine_requests_in_flight{engine=http://127.0.0.1:30000}"] == 5
    assert got["slime_engine_requests_in_flight{engine=http://127.0.0.1:30001}"] == 2


async def test_a_taken_metrics_port_is_an_error_naming_the_flag():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--metrics-port={port}"):
            await PrometheusExporter(host="127.0.0.1", port=port).start()


def test_scalars_flatten_nested_values_and_prefix_evals():
    s = scalars_of(STEP)
    assert s["reward_mean"] == 0.625 and s["lag_histogram/1"] == 30.0 and s["train/loss"] == -0.01
    assert "step" not in s and "kind" not in s
    assert scalars_of({"kind": "eval", "step": 0, "accuracy": 0.5, "failed": 0.0}) == {
        "eval/accuracy": 0.5,
        "eval/failed": 0.0,
    }


def test_tensorboard_gets_every_scalar_at_its_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = TensorBoardWriter(tmp_path / "tb")
    w.log(scalars_of(STEP), 3)
    w.log(scalars_of(dict(STEP, reward_mean=0.75)), 4)
    w.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(scalars_of(STEP)) <= set(acc.Tags()["scalars"])
    assert [(e.step, e.value) for e in acc.Scalars("reward_mean")] == [(3, 0.625), (4, 0.75)]


def test_wandb_asked_for_but_missing_names_the_flag(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match="--use-wandb.*not installed"):
        ScalarLoggers.from_config(ObsConfig(use_wandb=True), run_dir=tmp_path, config={})


def test_wandb_run_gets_project_group_config_and_each_record(tmp_path, monkeypatch):
    calls = []

    class Run:
        def log(self, data, step):
            calls.append(("log", step, data))

        def finish(self):
            calls.append(("finish",))

    fake = types.SimpleNamespace(init=lambda **kw: calls.append(("init", kw)) or Run())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    loggers = ScalarLoggers.from_config(
        ObsConfig(use_wandb=True, wandb_project="p", wandb_group="g"), run_dir=tmp_path, config={"seed": 1}
    )
    loggers.log(STEP)
    loggers.close()
    init, log, finish = calls
    assert init[1] == {"project": "p", "group": "g", "config": {"seed": 1}, "dir": str(tmp_path)}
    assert log[1] == 3 and log[2]["reward_mean"] == 0.625 and finish == ("finish",)


async def test_observers_fan_records_out_and_close_everything(tmp_path, capsys):
    config = Config(
        loop=LoopConfig(num_rollout=2),
        obs=ObsConfig(enable_trace=True, metrics_port=0, metrics_host="127.0.0.1", use_tensorboard=True),
    )
    async with Observers(
        config.obs, tmp_path, num_steps=config.loop.num_rollout, run_config=msgspec.to_builtins(config), progress=False
    ) as obs:
        obs.watch(pool=_Pool(), buffer=_Buffer())
        obs.record({"kind": "eval", "step": 0, "accuracy": 0.25})
        obs.record(STEP, "step   3 line")
        obs.record({"kind": "eval", "step": 3, "accuracy": 0.5}, "eval @ step 3: accuracy 0.500")
        got = await scrape(obs.exporter.port)
        assert got["slime_step"] == 3 and got["slime_eval_accuracy"] == 0.5
    # the step line carries the latest eval's accuracy (slime.obs.progress)
    assert capsys.readouterr().out.splitlines() == [
        "step   3 line | eval 0.250 @ step 0",
        "eval @ step 3: accuracy 0.500",
    ]
    trace = msgspec.json.decode((tmp_path / "trace.json").read_bytes())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"} == {"groups", "tokens_per_s"}
    assert list((tmp_path / "tb").iterdir())
    with pytest.raises(aiohttp.ClientConnectionError):
        await scrape(obs.exporter.port)
