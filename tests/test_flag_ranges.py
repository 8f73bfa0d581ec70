"""Every numeric value is checked at the door (issue 26 item 6): each numeric config field declares its range
(``slime.config._base.Range``), and a value outside it (``inf`` and ``nan`` included) is one line naming the flag
and the range, before anything starts.

The catalogue test walks the config tree, so a new numeric field without a range fails here; the flag test
walks ``FLAGS``, so each numeric flag is tried just outside each of its bounds.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec
import pytest

from slime.cli.args import FLAGS, build_parser, config_from_args
from slime.config import Config
from slime.errors import ConfigError


def _sections(cls: type = Config, prefix: str = "") -> list[tuple[str, type]]:
    """``(dotted path, struct class)`` of the root and every nested section (``train.megatron`` included)."""
    out = [(prefix, cls)]
    for f in msgspec.structs.fields(cls):
        if isinstance(f.default, msgspec.Struct):
            out += _sections(type(f.default), f"{prefix}{f.name}.")
    return out


def _numeric_fields() -> list[tuple[str, type, str]]:
    """``(config path, section class, field)`` of every field holding numbers."""
    from slime.config._base import field_ranges

    return [
        (p + name, cls, name) for p, cls in _sections() for name, (_, numeric) in field_ranges(cls).items() if numeric
    ]


def _flag_of_path() -> dict[str, str]:
    return {path: flag for flag, (path, _) in FLAGS.items() if "=" not in path}


def test_every_numeric_config_field_declares_its_range():
    from slime.config._base import field_ranges

    fields = _numeric_fields()
    assert len(fields) > 80  # the walk reaches every section, train.megatron included
    missing = [path for path, cls, name in fields if field_ranges(cls)[name][0] is None]
    assert not missing, f"numeric fields without a Range (slime/config/_base.py): {missing}"


def test_each_range_names_the_flag_that_sets_its_field():
    """The message names the CLI flag where one sets the field, else the field itself."""
    from slime.config._base import field_ranges

    flags = _flag_of_path()
    wrong = {}
    for path, cls, name in _numeric_fields():
        rng = field_ranges(cls)[name][0]
        assert rng is not None
        want = flags.get(path, name)
        if rng.flag_of(name) != want:
            wrong[path] = (rng.flag_of(name), want)
    assert not wrong, wrong


def test_every_numeric_flag_of_the_table_sets_a_field_with_a_range():
    numeric = {path for path, _, _ in _numeric_fields()}
    typed = [flag for flag, (path, kw) in FLAGS.items() if kw.get("type") in (int, float)]
    assert typed and all(FLAGS[flag][0] in numeric for flag in typed), [f for f in typed if FLAGS[f][0] not in numeric]


def _outside(rng: Any, is_int: bool) -> list[Any]:
    """Values just outside each bound of ``rng`` (ints for an int field)."""
    step = 1 if is_int else 1e-3
    values = []
    if rng.ge is not None:
        values.append(rng.ge - step)
    if rng.gt is not None:
        values.append(rng.gt if not is_int else int(rng.gt))
    if rng.le is not None:
        values.append(rng.le + step)
    if rng.lt is not None:
        values.append(rng.lt if not is_int else int(rng.lt))
    out = [int(v) if is_int else float(v) for v in values if v not in rng.also]
    return out + ([] if is_int else [math.inf, -math.inf, math.nan])


def _cases() -> list[tuple[str, Any]]:
    from slime.config._base import field_ranges

    by_path = {path: (cls, name) for path, cls, name in _numeric_fields()}
    cases = []
    for flag, (path, kw) in FLAGS.items():
        if kw.get("type") not in (int, float):
            continue
        cls, name = by_path[path]
        cases += [(flag, v) for v in _outside(field_ranges(cls)[name][0], kw["type"] is int)]
    return cases


CASES = _cases()


@pytest.mark.parametrize("flag, value", CASES, ids=[f"{f}={v}" for f, v in CASES])
def test_a_value_outside_its_range_is_one_line_naming_the_flag_and_the_range(flag, value):
    path, kw = FLAGS[flag]
    with pytest.raises(ConfigError) as info:
        config_from_args(build_parser().parse_args([f"{flag}={value}"]))
    message = str(info.value)
    shown = repr(kw["type"](str(value)))
    assert re.fullmatch(
        rf"{re.escape(flag)}={re.escape(shown)} is invalid: expected (a finite value )?\S.*", message
    ), message
    assert "\n" not in message


def test_each_range_admits_its_bounds_and_special_values_and_its_default():
    from slime.config._base import field_ranges

    for path, cls, name in _numeric_fields():
        rng = field_ranges(cls)[name][0]
        default = getattr(cls(), name)
        for v in default if isinstance(default, tuple) else (default,):
            assert v is None or rng.admits(v), (path, v)
        for v in (rng.ge, rng.le, *rng.also):
            if v is not None:
                assert rng.admits(v), (path, v)
        assert not rng.admits(True) and not rng.admits(math.nan)


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--num-eval-prompts", "-1"], "--num-eval-prompts=-1 is invalid: expected >= 0"),
        (["--n-samples-per-prompt", "100000"], "--n-samples-per-prompt=100000 is invalid: expected in [1, 1024]"),
        (["--lr", "inf"], "--lr=inf is invalid: expected a finite value > 0"),
        (["--rollout-top-k", "-5"], "--rollout-top-k=-5 is invalid: expected >= 1, or -1 (the whole vocabulary)"),
        (["--control-timeout-s", "0"], "--control-timeout-s=0.0 is invalid: expected > 0"),
        (["--weight-decay", "-0.1"], "--weight-decay=-0.1 is invalid: expected >= 0"),
        (["--adam-beta2", "1"], "--adam-beta2=1.0 is invalid: expected in [0, 1)"),
    ],
)
def test_the_issues_values_end_slime_train_at_the_door_with_one_line(tmp_path, capsys, argv, line):
    from slime.cli import main

    assert (
        main(["train", "--dry-run", "--save", str(tmp_path / "run"), *argv]) == 2
    )  # --dry-run: the old code returns, never runs
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"slime train: error: {line}"]
    assert not (tmp_path / "run").exists()  # nothing started


def test_a_tuple_of_numbers_is_checked_element_by_element():
    from slime.config import RolloutConfig

    RolloutConfig(rollout_stop_token_ids=(0, 7)).validate()
    with pytest.raises(ConfigError, match=re.escape("rollout_stop_token_ids=(3, -1) is invalid: expected >= 0")):
        RolloutConfig(rollout_stop_token_ids=(3, -1)).validate()


def test_a_range_says_itself_in_words():
    from slime.config._base import Range

    assert Range(ge=1).describe() == ">= 1"
    assert Range(gt=0, le=1).describe() == "in (0, 1]"
    assert Range(ge=0, lt=1).describe() == "in [0, 1)"
    assert Range(ge=1, also=(-1,), note="(off)").describe() == ">= 1, or -1 (off)"
    assert Range(gt=0, note=", or unset").describe() == "> 0, or unset"
    assert Range(ge=0, le=65535, flag="--port").flag_of("metrics_port") == "--port"


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "reinforce_plus_plus_baseline"])
def test_a_group_baseline_with_one_sample_per_prompt_is_refused_at_the_door(tmp_path, capsys, estimator):
    """Its advantages are all zero: GRPO on --n-samples-per-prompt 1 trained nothing without a word."""
    from slime.cli import main

    argv = [
        "train",
        "--dry-run",
        "--save",
        str(tmp_path / "run"),
        "--n-samples-per-prompt",
        "1",
        "--global-batch-size",
        "16",
    ]
    assert main([*argv, "--advantage-estimator", estimator]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"slime train: error: --n-samples-per-prompt 1 with --advantage-estimator {estimator}: ")
    assert "every advantage is 0 and nothing trains" in line and "--n-samples-per-prompt >= 2" in line


@pytest.mark.parametrize(
    "extra",
    [
        ["--advantage-estimator", "reinforce_plus_plus"],
        ["--advantage-estimator", "ppo"],
        ["--advantage-estimator", "reinforce_plus_plus_baseline", "--kl-coef", "0.1"],
        ["--debug-rollout-only"],
    ],
)
def test_one_sample_per_prompt_is_taken_where_something_still_trains(extra):
    parse = ["--n-samples-per-prompt", "1", "--global-batch-size", "16", *extra]
    assert config_from_args(build_parser().parse_args(parse)).rollout.n_samples_per_prompt == 1


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["--rollout-max-response-len", "1000000000"],
            "--rollout-max-response-len=1000000000 is invalid: expected in [1, 127]: the engines' context of 128 tokens "
            "(max_position_embeddings of --hf-checkpoint) less a prompt token",
        ),
        (["--eval-max-response-len", "128"], "--eval-max-response-len=128 is invalid: expected in [1, 127]"),
        (["--rollout-max-context-len", "129"], "--rollout-max-context-len=129 is invalid: expected in [2, 128]"),
    ],
)
def test_a_response_cap_the_models_context_cannot_hold_is_refused_at_the_door(tmp_path, capsys, argv, line):
    """The shipped arith warm start takes 128 tokens: every sample of a longer cap was refused by the engine."""
    from slime.cli import main

    assert main(["train", "--dry-run", "--save", str(tmp_path / "run"), *argv]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"slime train: error: {line}"), err


def test_the_engines_context_is_sglangs_when_given():
    from slime.cli.preflight import DEFAULT_CHECKPOINT, _engine_context

    config = Config(engine=msgspec.structs.replace(Config().engine, hf_checkpoint=DEFAULT_CHECKPOINT))
    assert _engine_context(config) == (128, "max_position_embeddings of --hf-checkpoint")
    longer = msgspec.structs.replace(
        config.engine, sglang_args=("--context-length", "4096", "--mem-fraction-static", "0.7")
    )
    assert _engine_context(msgspec.structs.replace(config, engine=longer)) == (4096, "--sglang-context-length")


def test_the_help_of_each_numeric_flag_says_its_range():
    from slime.config._base import field_ranges

    by_path = {path: (cls, name) for path, cls, name in _numeric_fields()}
    helps = {a.option_strings[0]: a.help for a in build_parser()._actions if a.option_strings}
    for flag, (path, kw) in FLAGS.items():
        if kw.get("type") in (int, float):
            cls, name = by_path[path]
            assert helps[flag].endswith(f"; allowed {field_ranges(cls)[name][0].describe()}"), (flag, helps[flag])
