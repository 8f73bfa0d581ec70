"""The trace is valid Trace Event Format JSON, nests per track, survives a crash, and records a real step."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import jsonschema
import pytest

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.loop.step import run_step
from slime.obs.trace import NULL_TRACER, Tracer, open_tracer
from slime.train_metrics import TrainMetrics
from tests.fixtures.fake_pool import FakePool

_BASE = {
    "type": "object",
    "required": ["ph", "name", "pid", "tid"],
    "properties": {
        "name": {"type": "string"},
        "cat": {"type": "string"},
        "pid": {"type": "integer"},
        "tid": {"type": "integer"},
        "ts": {"type": "number", "minimum": 0},
        "args": {"type": "object"},
    },
}
TRACE_EVENT_FORMAT = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Trace Event Format, JSON object form (the subset slime writes)",
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {"type": "array", "items": {"$ref": "#/$defs/event"}},
        "displayTimeUnit": {"enum": ["ms", "ns"]},
    },
    "$defs": {
        "event": {
            "allOf": [
                _BASE,
                {
                    "oneOf": [
                        {"$ref": "#/$defs/complete"},
                        {"$ref": "#/$defs/instant"},
                        {"$ref": "#/$defs/counter"},
                        {"$ref": "#/$defs/metadata"},
                    ]
                },
            ]
        },
        "complete": {
            "required": ["ts", "dur"],
            "properties": {"ph": {"const": "X"}, "dur": {"type": "number", "minimum": 0}},
        },
        "instant": {"required": ["ts"], "properties": {"ph": {"const": "i"}, "s": {"enum": ["g", "p", "t"]}}},
        "counter": {
            "required": ["ts", "args"],
            "properties": {
                "ph": {"const": "C"},
                "args": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "number"}},
            },
        },
        "metadata": {
            "required": ["args"],
            "properties": {"ph": {"const": "M"}},
            "oneOf": [
                {
                    "properties": {
                        "name": {"enum": ["process_name", "thread_name"]},
                        "args": {"required": ["name"], "properties": {"name": {"type": "string"}}},
                    }
                },
                {
                    "properties": {
                        "name": {"enum": ["process_sort_index", "thread_sort_index"]},
                        "args": {"required": ["sort_index"], "properties": {"sort_index": {"type": "integer"}}},
                    }
                },
            ],
        },
    },
}
GENERATE_ARGS = {
    "type": "object",
    "required": ["group_id", "index", "new_tokens", "tokens", "finish", "version", "resumed"],
    "properties": {
        "group_id": {"type": "integer"},
        "index": {"type": "integer", "minimum": 0},
        "tokens": {"type": "integer", "minimum": 0},
        "new_tokens": {"type": "integer", "minimum": 0},
        "version": {"type": "integer", "minimum": 0},
        "resumed": {"type": "boolean"},
        "finish": {"enum": ["completed", "truncated", "partial", "failed"]},
    },
}


def load_valid(path) -> list[dict]:
    trace = json.loads(path.read_text())
    jsonschema.validate(trace, TRACE_EVENT_FORMAT)
    assert trace["displayTimeUnit"] == "ms"
    return trace["traceEvents"]


def check_nesting(events: list[dict]) -> None:
    """On each track, complete events are disjoint or nested, never partly overlapping."""
    tracks = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append(e)
    for evs in tracks.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                parent = stack[-1]
                assert e["ts"] + e["dur"] <= parent["ts"] + parent["dur"], (
                    f"{e['name']} overlaps {parent['name']} on tid {e['tid']}"
                )
            stack.append(e)


def track_names(events: list[dict]) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}


async def test_concurrent_requests_take_separate_lanes_and_spans_nest(tmp_path):
    tr = Tracer(tmp_path / "trace.json")
    a, b = tr.begin("generate", "rollout"), tr.begin("generate", "rollout")
    with tr.span("step", "step"):
        with tr.span("train_step", "train") as args:
            await asyncio.sleep(0.002)
            args["loss"] = 0.5
        tr.instant("policy_version", "weight_sync", version=1)
    tr.end(b, group_id=1, index=0)
    c = tr.begin("generate", "rollout")  # reuses b's lane, now free
    tr.end(a, group_id=0, index=0)
    tr.end(c, group_id=2, index=0)
    tr.counter("requests_in_flight", requests=3)
    tr.close()
    events = load_valid(tmp_path / "trace.json")
    check_nesting(events)
    names = track_names(events)
    gen = {e["args"]["group_id"]: names[e["tid"]] for e in events if e["name"] == "generate"}
    assert gen == {0: "rollout 0", 1: "rollout 1", 2: "rollout 1"}
    train = next(e for e in events if e["name"] == "train_step")
    step = next(e for e in events if e["name"] == "step")
    assert train["args"] == {"loss": 0.5} and train["dur"] >= 1000 and names[step["tid"]] == "driver"
    assert step["ts"] <= train["ts"] and train["ts"] + train["dur"] <= step["ts"] + step["dur"]


def test_each_flush_leaves_valid_json_so_a_crash_keeps_the_events(tmp_path):
    tr = Tracer(tmp_path / "trace.json", flush_interval_s=0)
    for i in range(3):
        tr.complete("save", "weight_sync", tr.now(), version=i)  # flushes: interval 0
        assert [e["args"]["version"] for e in load_valid(tmp_path / "trace.json") if e["name"] == "save"] == list(
            range(i + 1)
        )
    tr.counter("tokens_per_s", tokens_per_s=12.5)  # recorded, not yet flushed: lost in a "crash" (no close)
    assert not any(e["ph"] == "C" for e in load_valid(tmp_path / "trace.json"))
    tr.close()
    tr.close()
    assert any(e["ph"] == "C" for e in load_valid(tmp_path / "trace.json"))


def test_a_failing_span_records_the_error_and_the_disabled_tracer_writes_nothing(tmp_path):
    tr = Tracer(tmp_path / "trace.json")
    with pytest.raises(RuntimeError), tr.span("load", "weight_sync"):
        raise RuntimeError("engine gone")
    tr.close()
    (load,) = [e for e in load_valid(tmp_path / "trace.json") if e["name"] == "load"]
    assert load["args"] == {"error": "RuntimeError"}
    off = open_tracer(False, tmp_path / "off.json")
    assert off is NULL_TRACER and off.begin("generate", "rollout") is None
    with off.span("x", "y") as args:
        args["k"] = 1
    off.end(None, a=1)
    off.close()
    assert not (tmp_path / "off.json").exists()


class _Sync:
    def __init__(self, pool):
        self.pool = pool

    async def save(self, version):
        await asyncio.sleep(0)
        return f"w{version}"

    async def load(self, path, version, *, abort_all_requests=True):
        await self.pool.update_weights_from_disk(path, weight_version=str(version))


async def _reward(sample):
    return float(len(sample.response_ids) % 2)


@pytest.mark.parametrize("mode", ["april", "async"])
async def test_scheduler_and_step_record_requests_rewards_and_phases(tmp_path, mode):
    tr = Tracer(tmp_path / "trace.json")
    pool, buffer = FakePool(), DataBuffer()
    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(
                mode=mode, rollout_batch_size=2, over_sampling_batch_size=4, overlap_train=False, max_staleness=4
            ),
            RolloutConfig(n_samples_per_prompt=2, rollout_max_response_len=32, reward_timeout_s=1.0),
            source=PromptSource([PromptRow(index=i, prompt=f"p{i}") for i in range(100)], shuffle=False),
            tokenize=lambda t: [1, 5, 7],
            decode=lambda ids: "",
            pool=pool,
            buffer=buffer,
            reward_fn=_reward,
            task_group=tg,
            tracer=tr,
        )
        for _ in range(3):
            groups, record = await run_step(
                sched, train_step=lambda gs: TrainMetrics(loss=0.0), sync=_Sync(pool), tracer=tr
            )
        assert sched.version.engines == 3
        await sched.shutdown()
    tr.close()
    events = load_valid(tmp_path / "trace.json")
    check_nesting(events)
    names = track_names(events)
    gens = [e for e in events if e["name"] == "generate"]
    assert gens and all(names[e["tid"]].startswith("rollout ") for e in gens)
    for e in gens:
        jsonschema.validate(e["args"], GENERATE_ARGS)
    if mode == "april":
        assert any(e["args"]["finish"] == "partial" for e in gens) and any(e["args"]["resumed"] for e in gens)
    per_sample = defaultdict(list)
    for e in gens:
        per_sample[(e["args"]["group_id"], e["args"]["index"])].append(e)
    for segs in per_sample.values():  # one request at a time per sample, tokens only grow
        segs.sort(key=lambda e: e["ts"])
        assert all(
            a["ts"] + a["dur"] <= b["ts"] and a["args"]["tokens"] <= b["args"]["tokens"] for a, b in zip(segs, segs[1:])
        )
    rewards = [e for e in events if e["name"] == "reward"]
    assert rewards
    for r in rewards:  # a reward starts after its sample's last segment
        last = max(per_sample[(r["args"]["group_id"], r["args"]["index"])], key=lambda e: e["ts"])
        assert r["ts"] >= last["ts"] + last["dur"]
    driver = [e for e in events if e["ph"] == "X" and names[e["tid"]] == "driver"]
    steps = [e for e in driver if e["name"] == "step"]
    assert len(steps) == 3
    inside = lambda e, p: p["ts"] <= e["ts"] and e["ts"] + e["dur"] <= p["ts"] + p["dur"]  # noqa: E731
    for step in steps:
        phases = sorted((e for e in driver if e is not step and inside(e, step)), key=lambda e: (e["ts"], -e["dur"]))
        assert [e["name"] for e in phases] == [
            "rollout_wait",
            "train_step",
            "weight_sync",
            "save",
            "pause",
            "load",
            "resume",
        ]
        sync = phases[2]
        assert all(inside(e, sync) for e in phases[3:])
    assert [e["args"]["version"] for e in events if e["name"] == "policy_version"] == [1, 2, 3]
    assert any(e["ph"] == "C" and e["name"] == "requests_in_flight" for e in events)
