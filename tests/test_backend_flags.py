"""Megatron-only flags on the torch backend: one line each naming the flag and what happens, an error where the value
would change what is trained (``slime.cli.backend_flags``; issue 31 item 4)."""

from __future__ import annotations

import logging

import pytest

from slime.cli import main
from slime.cli.args import FLAGS
from slime.cli.backend_flags import MEGATRON_ONLY

# the PERF_ARGS of THUDM/slime's run-qwen3-4B.sh (tests/data/slime_scripts/run_qwen3_4b.txt)
PERF_ARGS = [
    "--tensor-model-parallel-size",
    "2",
    "--sequence-parallel",
    "--pipeline-model-parallel-size",
    "1",
    "--context-parallel-size",
    "1",
    "--expert-model-parallel-size",
    "1",
    "--expert-tensor-parallel-size",
    "1",
    "--recompute-granularity",
    "full",
    "--recompute-method",
    "uniform",
    "--recompute-num-layers",
    "1",
]


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "slime.cli.backend_flags"]


def test_each_megatron_only_flag_on_the_torch_backend_is_one_line_naming_it(caplog, capsys):
    caplog.set_level(logging.INFO, logger="slime.cli.backend_flags")
    assert main(["train", "--dry-run", *PERF_ARGS]) == 0, capsys.readouterr().err
    lines = _lines(caplog)
    given = [t for t in PERF_ARGS if t.startswith("--")]
    assert sorted(line.split(":")[0].split(" ")[0] for line in lines) == sorted(given)  # each once
    assert lines[0] == (
        "--tensor-model-parallel-size 2: megatron backend only (--train-backend megatron); here: the torch backend "
        "keeps the whole model on one device (nothing is split): the same training, more memory"
    )
    assert (
        "--sequence-parallel: megatron backend only (--train-backend megatron); here: a megatron memory / speed "
        "setting; the torch backend trains the same without it"
    ) in lines


def test_on_the_megatron_backend_they_are_applied_and_not_logged(caplog, capsys):
    caplog.set_level(logging.INFO, logger="slime.cli.backend_flags")
    main(["train", "--dry-run", "--train-backend", "megatron", *PERF_ARGS])  # plans or refuses (no GPU): either way
    assert _lines(caplog) == []


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["--moe-aux-loss-coeff", "0.01"],
            "--moe-aux-loss-coeff 0.01: the torch backend trains no load-balancing loss",
        ),
        (["--moe-expert-capacity-factor", "1.5"], "--moe-expert-capacity-factor 1.5: the torch backend is dropless"),
    ],
)
def test_a_value_that_would_change_training_on_the_torch_backend_is_an_error(argv, words, capsys):
    assert main(["train", "--dry-run", *argv]) == 2
    assert words in capsys.readouterr().err


def test_a_zero_load_balancing_weight_is_a_line_and_every_listed_flag_is_a_flag(caplog, capsys):
    caplog.set_level(logging.INFO, logger="slime.cli.backend_flags")
    assert main(["train", "--dry-run", "--moe-aux-loss-coeff", "0"]) == 0, capsys.readouterr().err
    assert _lines(caplog) == [
        "--moe-aux-loss-coeff 0.0: megatron backend only (--train-backend megatron); here: the torch backend trains "
        "no load-balancing loss; only 0 is accepted"
    ]
    assert set(MEGATRON_ONLY) <= set(FLAGS)
