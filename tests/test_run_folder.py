"""A run without ``--save`` gets its own ``runs/<time>`` folder, ``runs/latest`` a link to the newest
(``slime.cli.run_folder``, ``slime.loop.run.fresh_run_dir``): a second such run starts (issue 31, item 7)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import slime.cli
from slime.cli import main


@pytest.fixture()
def fake_run(monkeypatch, tmp_path):
    """``_start_run`` replaced by a run that only writes its ``metrics.jsonl`` (where the engines would start)."""
    monkeypatch.chdir(tmp_path)
    for var in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    dirs: list[str] = []

    def start(config, prog, *, progress):
        Path(config.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(config.run_dir) / "metrics.jsonl").write_text(json.dumps({"kind": "step", "step": 1}) + "\n")
        dirs.append(config.run_dir)
        return f"done: run dir {config.run_dir}"

    monkeypatch.setattr(slime.cli, "_start_run", start)
    return dirs


def test_a_second_run_without_save_starts_in_a_new_folder_and_latest_follows(fake_run, tmp_path):
    assert main(["train", "--num-rollout", "1"]) == 0
    assert main(["train", "--num-rollout", "1"]) == 0  # before: refused, runs/latest already holds a run
    first, second = fake_run
    assert first != second and Path(first).parent == Path(second).parent == Path("runs")
    assert os.path.islink("runs/latest") and Path("runs/latest").resolve() == (tmp_path / second).resolve()


def test_save_and_load_keep_their_folder_and_leave_latest_alone(fake_run, tmp_path):
    assert main(["train", "--save", "mine"]) == 0
    assert fake_run == ["mine"] and not os.path.lexists("runs/latest")


def test_fresh_names_in_one_second_do_not_collide(tmp_path, monkeypatch):
    from slime.loop.run import fresh_run_dir

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr("slime.loop.run._launch_time", lambda: 1_700_000_000.0)
    first = fresh_run_dir(str(tmp_path / "runs" / "latest"))
    Path(first).mkdir(parents=True)
    second = fresh_run_dir(str(tmp_path / "runs" / "latest"))
    assert second == f"{first}-2"


def test_an_old_latest_folder_is_left_as_it_is(tmp_path):
    from slime.loop.run import point_latest

    (tmp_path / "latest").mkdir()
    assert not point_latest(str(tmp_path / "latest"), str(tmp_path / "20261203-120000"))
    assert (tmp_path / "latest").is_dir() and not (tmp_path / "latest").is_symlink()
