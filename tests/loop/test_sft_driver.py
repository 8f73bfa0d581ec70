"""The SFT run of ``slime train --loss-type sft_loss``: logs, eval loss, final model, and exact resume mid-epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from slime.cli.args import build_parser, config_from_args
from slime.config import DataConfig
from slime.errors import ConfigError
from slime.loop.sft import load_sft_data, run_sft
from tests.fixtures.tiny_model import write_tiny_llama

ROWS = [{"prompt": f"w{3 + i} w{10 + i}", "response": f"w{20 + i} w{30 + i} w{40 + i}"} for i in range(7)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", seed=0, with_tokenizer=True)


@pytest.fixture
def data(tmp_path) -> tuple[Path, Path]:
    train, evals = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    evals.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:2]))
    return train, evals


def _config(model_dir, data, run_dir, *extra):
    train, evals = data
    argv = [
        "--loss-type",
        "sft_loss",
        "--hf-checkpoint",
        str(model_dir),
        "--prompt-data",
        str(train),
        "--eval-prompt-data",
        str(evals),
        "--input-key",
        "prompt",
        "--rollout-batch-size",
        "3",
        "--global-batch-size",
        "3",
        "--micro-batch-size",
        "2",
        "--rollout-shuffle",
        "--lr",
        "1e-2",
        "--train-threads",
        "1",
        "--save",
        str(run_dir),
        "--seed",
        "3",
        *extra,
    ]
    return config_from_args(build_parser().parse_args(argv))


def _records(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


async def test_sft_run_logs_steps_eval_loss_and_writes_the_final_model(model_dir, data, tmp_path):
    run = tmp_path / "run"
    summary = await run_sft(_config(model_dir, data, run, "--num-rollout", "4", "--eval-interval", "2"), progress=False)
    records = _records(run, "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records] == [
        ("eval", 0),
        ("step", 1),
        ("step", 2),
        ("eval", 2),
        ("step", 3),
        ("step", 4),
        ("eval", 4),
    ]
    evals = [r["eval_loss"] for r in records if r["kind"] == "eval"]
    assert evals[-1] < evals[0] and all(
        r["eval_tokens"] == 8.0 for r in records if r["kind"] == "eval"
    )  # 2 rows x (3 words + EOS)
    steps = [r for r in records if r["kind"] == "step"]
    assert all(r["trained_tokens"] == 12 and r["num_rows"] == 3 and r["train/loss"] > 0 for r in steps)
    assert (
        summary["eval_loss_before"] == evals[0]
        and summary["eval_loss_after"] == evals[-1]
        and summary["num_steps"] == 4
    )
    AutoModelForCausalLM.from_pretrained(summary["model_dir"])  # an HF directory
    report = (run / "report.txt").read_text()
    assert "mode sft" in report and f"eval loss        {evals[0]:.4f} -> {evals[-1]:.4f}" in report
    # 4 steps x 3 rows over 7 rows: every row of epoch 0 exactly once, then epoch 1 begins
    trained = [i for r in _records(run, "trained_rows.jsonl") for i in r["data_index"]]
    assert sorted(trained[:7]) == list(range(7)) and len(set(trained[7:])) == 5


async def test_resume_mid_epoch_continues_at_the_right_row_with_the_same_losses(model_dir, data, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    await run_sft(_config(model_dir, data, full, "--num-rollout", "5", "--save-interval", "2"), progress=False)
    await run_sft(
        _config(model_dir, data, cut, "--num-rollout", "3", "--save-interval", "2"), progress=False
    )  # stops in epoch 1, row 2
    assert json.loads((cut / "checkpoints" / "step_000003" / "loop.json").read_text())["source"] == {
        "epoch": 1,
        "position": 2,
    }
    await run_sft(
        _config(model_dir, data, cut, "--num-rollout", "5", "--save-interval", "2", "--load", str(cut)), progress=False
    )
    assert _records(cut, "trained_rows.jsonl") == _records(full, "trained_rows.jsonl")

    def loss(run):
        return [
            (r["step"], r["train/loss"], r["train/lr"]) for r in _records(run, "metrics.jsonl") if r["kind"] == "step"
        ]

    assert [s for s, _, _ in loss(cut)] == [1, 2, 3, 4, 5]
    for (_, a, lr_a), (_, b, lr_b) in zip(loss(cut), loss(full)):
        assert a == pytest.approx(b, rel=1e-6) and lr_a == lr_b


async def test_sft_refuses_what_it_cannot_honour(model_dir, data, tmp_path):
    with pytest.raises(ConfigError, match="--rollout-temperature"):
        await run_sft(_config(model_dir, data, tmp_path / "r", "--rollout-temperature", "0.7"), progress=False)


async def test_num_epoch_sets_the_number_of_steps(model_dir, data, tmp_path):
    summary = await run_sft(_config(model_dir, data, tmp_path / "r", "--num-epoch", "2"), progress=False)
    assert summary["num_steps"] == 2 * 7 // 3


# THUDM/slime's SFT scripts (scripts/run-qwen3-4B-base-sft.sh): implied here, accepted
THUDM_SFT_FLAGS = [
    "--rollout-function-path",
    "slime.rollout.sft_rollout.generate_rollout",
    "--disable-compute-advantages-and-returns",
    "--debug-train-only",
]


def test_thudm_slime_sft_flags_are_accepted_as_implied_in_one_line(model_dir, data, tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="slime.config.root")
    config = _config(model_dir, data, tmp_path / "r", *THUDM_SFT_FLAGS)
    config.check_run_modes()  # preflight's check: --debug-train-only needs no record file here
    config.check_sft_run()
    assert [r.getMessage() for r in caplog.records if "implied by --loss-type sft_loss" in r.getMessage()] == [
        "--debug-train-only, --rollout-function-path slime.rollout.sft_rollout.generate_rollout: implied by --loss-type sft_loss "
        "(no engine is launched; it trains on the rows of --prompt-data)"
    ]
    with pytest.raises(
        ConfigError, match="--rollout-function-path=my.rollout: --loss-type sft_loss .* calls no rollout function"
    ):
        _config(model_dir, data, tmp_path / "r", "--rollout-function-path", "my.rollout").check_sft_run()
    rl = config_from_args(
        build_parser().parse_args(["--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout"])
    )
    with pytest.raises(ConfigError, match="is THUDM/slime's SFT: pass --loss-type sft_loss"):
        rl.check_run_modes()


def test_slime_train_cli_runs_sft_and_prints_the_eval_loss(model_dir, data, tmp_path, capsys):
    from slime.cli import main

    train, evals = data
    argv = [
        "train",
        "--loss-type",
        "sft_loss",
        "--hf-checkpoint",
        str(model_dir),
        "--prompt-data",
        str(train),
        "--eval-prompt-data",
        str(evals),
        "--input-key",
        "prompt",
        "--rollout-batch-size",
        "2",
        "--global-batch-size",
        "2",
        "--num-rollout",
        "2",
        "--train-threads",
        "1",
        "--save",
        str(tmp_path / "run"),
        "--no-progress",
        "--log-level",
        "WARNING",
        *THUDM_SFT_FLAGS,
    ]
    assert main(argv) == 0
    assert "done: SFT 2 steps; eval loss" in capsys.readouterr().out
    assert main(argv) == 2  # the run directory is used: resume it with --load, or choose another --save


async def test_sft_run_refuses_a_row_longer_than_the_model_context_by_file_and_line(tmp_path):
    from slime.errors import DataError

    small = write_tiny_llama(tmp_path / "small", seed=0, with_tokenizer=True, max_position_embeddings=5)
    train, evals = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text(json.dumps(ROWS[0]) + "\n")  # 2 prompt words + 3 response words + EOS: 6 tokens
    evals.write_text(json.dumps(ROWS[1]) + "\n")
    with pytest.raises(DataError, match=rf"{train}:1: the row renders to 6 tokens, more than the model's context of 5"):
        await run_sft(_config(small, (train, evals), tmp_path / "run", "--num-rollout", "1"), progress=False)


async def test_a_step_larger_than_the_data_is_refused_with_num_epoch(model_dir, data, tmp_path):
    config = _config(
        model_dir, data, tmp_path / "r", "--num-epoch", "1", "--rollout-batch-size", "100", "--global-batch-size", "100"
    )
    with pytest.raises(ConfigError, match=r"--rollout-batch-size=100 is larger than --prompt-data \(7 rows\)"):
        await run_sft(config, progress=False)


def test_rl_flags_an_sft_run_never_reads_are_named_in_a_warning(model_dir, data, tmp_path, caplog):

    _config(model_dir, data, tmp_path / "r").check_sft_run()
    assert "ignores these RL flags" not in caplog.text
    _config(
        model_dir,
        data,
        tmp_path / "r",
        "--partial-rollout",
        "--use-tis",
        "--rm-type",
        "math",
        "--num-epoch",
        "1",
        "--num-rollout",
        "5",
    ).check_sft_run()
    assert (
        "ignores these RL flags: --rollout-mode / --partial-rollout, --rm-type, --use-tis, "
        "--num-rollout (with --num-epoch, the epochs set the steps)"
    ) in caplog.text


async def test_sft_skips_the_eval_before_training_and_warms_up_over_a_fraction_of_its_steps(model_dir, data, tmp_path):
    run = tmp_path / "run"
    summary = await run_sft(
        _config(model_dir, data, run, "--num-rollout", "4", "--skip-eval-before-train", "--lr-warmup-fraction", "0.5"),
        progress=False,
    )
    records = _records(run, "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records if r["kind"] == "eval"] == [("eval", 4)]
    assert summary["eval_loss_before"] is None and summary["eval_loss_after"] is not None
    # 4 optimizer steps, warm-up 0.5 x 4 = 2: lr 1e-2 x 1/2, 1e-2, then constant
    assert [r["train/lr"] for r in records if r["kind"] == "step"] == pytest.approx([5e-3, 1e-2, 1e-2, 1e-2])


def test_loading_sft_data_without_prompt_data_names_the_flag():
    with pytest.raises(ConfigError, match="needs --prompt-data"):
        load_sft_data(DataConfig(), tokenizer=None)
