"""The CLI surface of `slime train` is pinned, and every flag reaches a config field."""

from __future__ import annotations

import re

import msgspec
import pytest

from slime.cli.args import FLAGS, build_parser, config_from_args
from slime.config import Config
from slime.errors import ConfigError

PINNED = {
    "--hf-checkpoint",
    "--rollout-external-engine-addrs",
    "--rollout-num-engines",
    "--ray-placed-engines",
    "--engine-threads",
    "--max-running-requests",
    "--engine-startup-timeout-s",
    "--prompt-data",
    "--builtin-task",
    "--input-key",
    "--label-key",
    "--metadata-key",
    "--rollout-shuffle",
    "--eval-prompt-data",
    "--num-eval-prompts",
    "--on-bad-data",
    "--rollout-batch-size",
    "--over-sampling-batch-size",
    "--partial-rollout",
    "--rollout-mode",
    "--staleness-policy",
    "--dynamic-sampling-filter-path",
    "--buffer-filter-path",
    "--num-rollout",
    "--max-staleness",
    "--eval-interval",
    "--overlap-train",
    "--n-samples-per-prompt",
    "--rollout-max-response-len",
    "--rollout-temperature",
    "--rollout-top-p",
    "--rollout-top-k",
    "--request-timeout-s",
    "--reward-timeout-s",
    "--max-retries",
    "--control-timeout-s",
    "--retry-backoff-s",
    "--custom-rm-path",
    "--reward-key",
    "--custom-generate-function-path",
    "--rollout-function-path",
    "--rm-type",
    "--rm-url",
    "--allow-unsafe-code-execution",
    "--global-batch-size",
    "--micro-batch-size",
    "--lr",
    "--weight-decay",
    "--adam-beta1",
    "--adam-beta2",
    "--clip-grad",
    "--calculate-per-token-loss",
    "--eps-clip",
    "--eps-clip-high",
    "--use-tis",
    "--use-rollout-logprobs",
    "--use-rollout-routing-replay",
    "--tis-clip",
    "--tis-clip-low",
    "--train-threads",
    "--train-device",
    "--save",
    "--save-interval",
    "--load",
    "--seed",
    "--advantage-estimator",
    "--disable-grpo-std-normalization",
    "--normalize-advantages",
    "--gamma",
    "--lambd",
    "--eps-clip-c",
    "--entropy-coef",
    "--use-kl-loss",
    "--kl-loss-coef",
    "--kl-loss-type",
    "--kl-coef",
    "--ref-load",
    "--value-clip",
    "--critic-lr",
    "--mis-level",
    "--mis-lower-bound",
    "--mis-upper-bound",
    "--use-decoupled-ppo",
    "--behav-imp-weight-cap",
    "--mask-offpolicy-in-partial-rollout",
    "--train-backend",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--moe-token-dispatcher-type",
    "--moe-router-load-balancing-type",
    "--moe-aux-loss-coeff",
    "--moe-router-bias-update-rate",
    "--moe-expert-capacity-factor",
    "--sequence-parallel",
    "--use-dynamic-batch-size",
    "--max-tokens-per-gpu",
    "--min-lr",
    "--lr-decay-style",
    "--lr-warmup-iters",
    "--lr-decay-iters",
    "--adam-eps",
    "--bf16",
    "--use-distributed-optimizer",
    "--overlap-grad-reduce",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--distributed-timeout-minutes",
    "--logprob-impl",
    "--weight-sync",
    "--update-weight-buffer-size",
    "--colocate",
    "--actor-num-nodes",
    "--actor-num-gpus-per-node",
    "--rollout-num-gpus",
    "--rollout-num-gpus-per-engine",
    "--sglang-router-ip",
    "--sglang-router-port",
    "--sglang-config",
    "--health-check-interval-s",
    "--enable-trace",
    "--metrics-port",
    "--use-tensorboard",
    "--tb-dir",
    "--use-wandb",
    "--wandb-project",
    "--wandb-group",
    "--apply-chat-template",
    "--tool-key",
    "--curriculum-key",
    "--offline-data",
    "--offline-ratio",
    "--buffer-capacity",
    "--n-samples-per-eval-prompt",
    "--eval-temperature",
    "--eval-top-p",
    "--eval-max-response-len",
    "--save-debug-rollout-data",
    "--load-debug-rollout-data",
    "--debug-rollout-only",
    "--debug-train-only",
    "--use-opd",
    "--opd-kl-coef",
    "--opd-only",
    "--opd-teacher-load",
    "--opd-teacher-addrs",
    "--loss-type",
    "--num-epoch",
    # THUDM/slime script flags of issue 16 item 1
    "--tis-level",
    "--lr-warmup-fraction",
    "--rollout-max-prompt-len",
    "--deterministic-mode",
    "--eval-top-k",
    "--skip-eval-before-train",
    "--rollout-num-gpus-per-node",
    "--rollout-max-context-len",
    "--eval-config",
    "--custom-reward-post-process-path",
}
FLOAT_VALUES = {
    "--eps-clip-c": 3.0,
    "--behav-imp-weight-cap": 5.0,
    "--retry-backoff-s": 0.25,
}  # > 1 for the first two; 0.5 is the backoff default


def test_flag_list_is_pinned():
    assert set(FLAGS) == PINNED


def _get(config, path):
    node = msgspec.to_builtins(config)
    for p in path.split("."):
        node = node[p]
    return node


NARGS_VALUES = {"--ray-placed-engines": ["actor=http://127.0.0.1:1", "router=http://127.0.0.1:2"]}
"""List flags whose values have a shape of their own (the rest take two host:port addresses)."""


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_every_flag_reaches_its_field(flag, tmp_path):
    path, kwargs = FLAGS[flag]
    parser = build_parser()
    field = path.split("=")[0]
    default = _get(Config(), field)
    if kwargs.get("action") in ("store_true",):
        argv, expect = [flag], (path.split("=")[1] if "=" in path else True)
    elif kwargs.get("nargs") == "+":
        values = NARGS_VALUES.get(flag, ["127.0.0.1:1", "127.0.0.1:2"])
        argv, expect = [flag, *values], values
    elif "choices" in kwargs:
        choice = next(c for c in kwargs["choices"] if c != default)
        argv, expect = [flag, choice], choice
    elif kwargs.get("type") is int:
        argv, expect = [flag, "128"], 128
    elif kwargs.get("type") is float:
        expect = FLOAT_VALUES.get(flag, 0.5)
        argv = [flag, str(expect)]
    elif "action" in kwargs:  # BooleanOptionalAction
        argv, expect = ["--no-" + flag[2:]], False
    else:
        argv, expect = [flag, "some/value"], "some/value"
    base = ["--rollout-batch-size", "128", "--over-sampling-batch-size", "256", "--global-batch-size", "128"]
    if flag in ("--rollout-batch-size", "--global-batch-size", "--over-sampling-batch-size"):
        base = [a for i, a in enumerate(base) if a != flag and (i == 0 or base[i - 1] != flag)]
    if flag == "--num-epoch":  # an SFT flag: RL runs refuse it
        base += ["--loss-type", "sft_loss"]
    if flag in ("--prompt-data", "--eval-prompt-data", "--eval-config"):  # the user's data: a run names its reward
        base += ["--rm-type", "math"]
    if flag == "--tis-level":  # the level of TIS: with --use-tis
        base += ["--use-tis"]
    if flag == "--use-rollout-routing-replay":  # the megatron trainer replays the routes
        base += ["--train-backend", "megatron"]
    if flag in (
        "--custom-reward-post-process-path",
        "--opd-only",
    ):  # THUDM/slime's OPD hook, pure distillation: only with --use-opd
        base += ["--use-opd"]
    if flag in ("--save-debug-rollout-data", "--load-debug-rollout-data"):  # a path template, one file per step
        argv, expect = [flag, "some/{rollout_id}"], "some/{rollout_id}"
    if flag == "--eval-config":  # a file it reads (tests/test_eval_config.py)
        (tmp_path / "eval.yaml").write_text("eval:\n  datasets: [{name: a, path: a.jsonl}]\n")
        argv, expect = [flag, str(tmp_path / "eval.yaml")], str(tmp_path / "eval.yaml")
    config = config_from_args(parser.parse_args(base + argv))
    got = _get(config, field)
    assert (list(got) if isinstance(got, (list, tuple)) else got) == expect


def test_each_flag_sets_one_field_and_the_trainer_is_handed_the_facts_it_needs():
    c = config_from_args(
        build_parser().parse_args(
            [
                "--n-samples-per-prompt",
                "4",
                "--global-batch-size",
                "64",
                "--rollout-temperature",
                "0.7",
                "--seed",
                "9",
                "--max-staleness",
                "2",
            ]
        )
    )
    assert (
        c.rollout.n_samples_per_prompt == 4
        and c.rollout.rollout_temperature == 0.7
        and c.seed == 9
        and c.loop.max_staleness == 2
    )
    assert c.trainer_kwargs() == dict(rollout_temperature=0.7, max_staleness=2, seed=9)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--rollout-batch-size", "0"], "--rollout-batch-size"),
        (["--rollout-batch-size", "8", "--over-sampling-batch-size", "4"], "--over-sampling-batch-size"),
        (["--rollout-top-p", "1.5"], "--rollout-top-p"),
        (["--lr", "-1"], "--lr"),
        (["--global-batch-size", "7"], "--global-batch-size"),
        (["--rollout-temperature", "0"], "--rollout-temperature"),
    ],
)
def test_bad_values_name_the_flag(argv, flag):
    with pytest.raises(ConfigError, match=flag):
        config_from_args(build_parser().parse_args(argv))


def test_num_epoch_is_refused_outside_sft():
    with pytest.raises(ConfigError, match="--num-epoch"):
        config_from_args(build_parser().parse_args(["--num-epoch", "2"]))


def test_sft_batch_counts_rows_not_samples_per_prompt():
    argv = [
        "--loss-type",
        "sft_loss",
        "--rollout-batch-size",
        "64",
        "--global-batch-size",
        "64",
        "--n-samples-per-prompt",
        "8",
    ]
    assert config_from_args(build_parser().parse_args(argv)).train.loss_type == "sft_loss"
    with pytest.raises(ConfigError, match="--global-batch-size"):
        config_from_args(
            build_parser().parse_args(
                ["--loss-type", "sft_loss", "--rollout-batch-size", "64", "--global-batch-size", "48"]
            )
        )


def test_every_flag_has_help_text_taken_from_its_config_docstring_when_the_table_has_none():
    parser = build_parser()
    empty = [
        a.option_strings[0]
        for a in parser._actions
        if a.option_strings and a.option_strings[0] != "-h" and not (a.help or "").strip()
    ]
    assert empty == []
    lr = next(a for a in parser._actions if "--num-rollout" in a.option_strings)
    assert "Rollout steps" in lr.help and "(default: 50)" in lr.help
    parser.format_help()  # every help string survives argparse's %-formatting


# Conflicting flags are one error naming both ("pick one"); own data names its reward


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--partial-rollout", "--rollout-mode", "sync"], "--partial-rollout and --rollout-mode sync: pick one"),
        (["--rollout-mode", "async", "--partial-rollout"], "--partial-rollout and --rollout-mode async: pick one"),
        (["--custom-rm-path", "myrm.ok", "--rm-type", "math"], "--custom-rm-path myrm.ok and --rm-type math: pick one"),
        (
            ["--prompt-data", "f.jsonl", "--builtin-task", "chain", "--rm-type", "math"],
            "--builtin-task chain and --prompt-data f.jsonl: pick one (--builtin-task is the data and reward used without "
            "--prompt-data; to score your rows with its reward pass --rm-type chain)",
        ),
    ],
)
def test_conflicting_flags_are_one_error_naming_both(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_args(build_parser().parse_args(argv))


def test_partial_rollout_alone_or_with_rollout_mode_april_is_april():
    for argv in (["--partial-rollout"], ["--partial-rollout", "--rollout-mode", "april"]):
        assert config_from_args(build_parser().parse_args(argv)).loop.mode == "april"


def test_own_prompt_data_without_a_reward_is_an_error_listing_the_ways_to_give_one():
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "--prompt-data qa.jsonl needs a reward: pass --rm-type math|code|remote (a built-in verifier; --rm-type arith|calc|chain "
            "for rows in a built-in task's format) or --custom-rm-path pkg.module.fn (your function); runs that need none: "
            "--loss-type sft_loss, --opd-only"
        ),
    ):
        config_from_args(build_parser().parse_args(["--prompt-data", "qa.jsonl", "--input-key", "question"]))
    for ok in (
        ["--rm-type", "arith"],
        ["--custom-rm-path", "slime.data.arith.reward"],
        ["--loss-type", "sft_loss", "--global-batch-size", "16"],
        ["--use-opd", "--opd-only", "--opd-teacher-addrs", "h:1"],
        ["--debug-train-only", "--load-debug-rollout-data", "r_{rollout_id}.msgpack"],
        ["--rollout-function-path", "my_pkg.rollout.generate_rollout"],  # a user rollout function may reward itself
    ):
        config_from_args(build_parser().parse_args(["--prompt-data", "qa.jsonl", *ok]))
    config_from_args(build_parser().parse_args(["--builtin-task", "chain"]))  # the built-in task: its own reward


def test_rm_type_of_a_builtin_task_is_its_reward():
    from slime.config import RolloutConfig
    from slime.data import arith, calc, chain
    from slime.rollout.verifiers import reward_fn_from_config

    for name, task in (("arith", arith), ("calc", calc), ("chain", chain)):
        assert reward_fn_from_config(RolloutConfig(rm_type=name)) is task.reward
