"""``--load RUN_DIR``: the saved run's config is the base, only ``RESUMABLE`` flags may change it, a contradicting
flag is an error naming both values (``slime.cli.resume_flags``; issue 31 item 1). The whole resumed run, its
eval set and metrics: tests/e2e/test_load_alone.py."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import msgspec
import pytest

from slime.cli import main
from slime.cli.args import build_parser, config_from_args
from slime.cli.resume_flags import RESUMABLE, resumable_flags

ORIGINAL = ["--prompt-data", "mine.jsonl", "--rm-type", "math", "--rollout-batch-size", "2", "--num-rollout", "2"]
ORIGINAL += ["--global-batch-size", "16", "--hf-checkpoint", "/root/Qwen3-4B"]
ORIGINAL += ["--eval-prompt-data", "heldout.jsonl", "--n-samples-per-eval-prompt", "4", "--eval-temperature", "0.6"]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run folder as a run leaves it: its ``config.json`` (the flags' config, its paths of another machine)."""
    config = config_from_args(build_parser().parse_args([*ORIGINAL, "--save", str(tmp_path / "run")]))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_bytes(msgspec.json.encode(config))
    return tmp_path / "run"


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "slime.cli" and r.getMessage().startswith("--load")]


def test_load_alone_restores_the_saved_run_and_a_resumable_flag_changes_it(run, caplog, capsys):
    caplog.set_level(logging.INFO, logger="slime.cli")
    assert main(["train", "--dry-run", "--load", str(run)]) == 0, capsys.readouterr().err
    assert _lines(caplog) == [f"--load {run}: the saved run's configuration ({run / 'config.json'})"]
    assert "--prompt-data mine.jsonl, --eval-prompt-data heldout.jsonl" in capsys.readouterr().out  # its data
    caplog.clear()
    assert main(["train", "--dry-run", "--load", str(run), "--num-rollout", "9"]) == 0
    assert _lines(caplog) == [
        f"--load {run}: the saved run's configuration ({run / 'config.json'}); --num-rollout 2 -> 9"
    ]


def test_repeating_the_saved_flags_on_resume_is_accepted(run, capsys):
    assert main(["train", "--dry-run", *ORIGINAL, "--load", str(run), "--save", str(run)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--rollout-batch-size", "4"], "--rollout-batch-size 4 (saved: loop.rollout_batch_size = 2)"),
        (["--prompt-data", "other.jsonl"], "--prompt-data 'other.jsonl' (saved: data.prompt_data = 'mine.jsonl')"),
        (["--eval-temperature", "1.0"], "--eval-temperature 1.0 (saved: rollout.eval_temperature = 0.6)"),
        (["--rollout-mode", "async"], "--rollout-mode 'async' (saved: loop.mode = 'sync')"),
    ],
)
def test_a_flag_that_contradicts_the_saved_run_is_an_error_naming_both_values(run, argv, said, capsys):
    assert main(["train", "--dry-run", "--load", str(run), *argv]) == 2
    err = capsys.readouterr().err
    assert f"--load {run}: contradicts the saved run ({run / 'config.json'}): {said}. On resume only these" in err
    assert "--num-rollout" in err.split("may change: ")[1]


def test_a_load_folder_without_a_saved_config_takes_the_flags_alone(tmp_path, capsys):
    # THUDM/slime's scripts pass --load with --save on the first run too
    argv = ["--load", str(tmp_path / "new"), "--save", str(tmp_path / "new"), "--rollout-batch-size", "16"]
    assert main(["train", "--dry-run", *argv]) == 0, capsys.readouterr().err


def test_a_saved_config_that_is_not_one_is_an_error_naming_the_file(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"loop": {"rollout_batch_size": "many"}}')
    assert main(["train", "--dry-run", "--load", str(tmp_path)]) == 2
    assert f"{tmp_path / 'config.json'} is not a run configuration of this slime" in capsys.readouterr().err


def test_the_docs_list_every_flag_that_may_change_on_resume():
    doc = (Path(__file__).parents[1] / "docs" / "slime_flags.md").read_text()
    section = doc.split("## Resuming with --load")[1].split("\n## ")[0]
    assert [flag for flag in resumable_flags() if f"`{flag}`" not in section] == []
    assert "--num-rollout" in resumable_flags() and "--rollout-batch-size" not in resumable_flags()
    assert not any(re.match(r"(data|train\.lr|rollout\.rollout_)", p) for p in RESUMABLE)
