"""The run folder keeps ``train.log`` and ``failed_samples.jsonl``; a warning repeated within a step is one line and
a count on the console (``slime.obs.run_log``, opened by ``Observers``; issue 31 item 7)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from slime.config import ObsConfig
from slime.obs.observers import Observers
from slime.rollout.rewards import score_sample
from slime.types import Sample, Status


@pytest.fixture()
def console(monkeypatch):
    """slime train's console: a plain StreamHandler on the root logger (``logging.basicConfig``), at INFO."""
    monkeypatch.delenv("RANK", raising=False)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield out
    root.removeHandler(handler)
    root.setLevel(old_level)


def _sample(i: int) -> Sample:
    s = Sample(prompt_ids=[1, 2], prompt=f"what is {i}+1?", label=str(i + 1), group_id=3, index=i)
    s.append([5, 6], [-0.1, -0.2], 0)
    s.response, s.status = f"{i + 1} apples", Status.COMPLETED
    return s


async def _raising(sample):
    raise KeyError("answer")


async def test_failed_rewards_are_one_line_and_a_count_and_every_one_is_kept(tmp_path, console):
    async with Observers(ObsConfig(), tmp_path, num_steps=1, run_config={}, progress=False) as obs:
        logging.getLogger("slime.loop").info("step 1 starts")
        for i in range(5):
            await score_sample(_sample(i), _raising, timeout_s=5)
        obs.record({"kind": "step", "step": 1}, "step   1 reward 0.000")
    shown = console.getvalue().splitlines()
    assert [line for line in shown if "reward failed" in line and "more like it" not in line] == [shown[1]]
    assert "KeyError: 'answer'" in shown[1] and "group 3 sample 0" in shown[1]
    assert "... and 4 more like it in step 1 (every one in train.log): reward failed for group 3 sample 0" in shown[2]
    kept = (tmp_path / "train.log").read_text()
    assert kept.count("reward failed") == 5 and "step 1 starts" in kept
    assert kept.rstrip().endswith("INFO slime.progress: step   1 reward 0.000")  # the printed step line too
    rows = [json.loads(line) for line in (tmp_path / "failed_samples.jsonl").read_text().splitlines()]
    assert [(r["group_id"], r["index"]) for r in rows] == [(3, i) for i in range(5)]
    assert rows[2]["prompt"] == "what is 2+1?" and rows[2]["response"] == "3 apples" and rows[2]["label"] == "3"
    assert rows[2]["error"]["type"] == "KeyError" and "raise KeyError" in rows[2]["error"]["traceback"]


async def test_a_repeat_in_the_next_step_is_shown_again_and_closing_removes_the_handlers(tmp_path, console):
    root = logging.getLogger()
    before = list(root.handlers)
    async with Observers(ObsConfig(), tmp_path, num_steps=2, run_config={}, progress=False) as obs:
        log = logging.getLogger("slime.test")
        for step in (1, 2):
            log.warning("engine %s slow", step)
            log.warning("engine %s slow", step + 10)
            obs.record({"kind": "step", "step": step}, f"step {step}")
    lines = console.getvalue().splitlines()
    assert lines.count("WARNING slime.test: engine 1 slow") == 1 and "WARNING slime.test: engine 2 slow" in lines
    assert sum("1 more like it" in line for line in lines) == 2
    assert root.handlers == before and not any(h.filters for h in root.handlers if type(h) is logging.StreamHandler)
    log.warning("after the run")
    assert "after the run" not in (tmp_path / "train.log").read_text()


def test_the_field_names_of_rollout_and_obs_agree():
    from slime.obs.run_log import FAILED_SAMPLE_FIELD as read
    from slime.rollout.rewards import FAILED_SAMPLE_FIELD as written

    assert read == written
