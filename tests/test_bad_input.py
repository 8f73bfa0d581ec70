"""The bad-input catalogue: each kind of bad input gives an error that names the problem and its place.

Places: ``file:line`` for data, the flag for configuration and plugins, group and sample index for reward
and generate plugins (engine answers: tests/engines/test_bad_engine_answers.py, engine URL + endpoint).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re

import pytest

from slime.cli import main as slime_main
from slime.cli.args import build_parser, config_from_args
from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow, PromptSource, load_jsonl_prompts
from slime.errors import ConfigError, DataError, PluginError
from slime.loop.buffer import DataBuffer
from slime.loop.scheduler import Scheduler
from slime.rollout.rewards import score_group, score_sample
from slime.types import Sample, Status
from tests.fixtures.fake_pool import FakePool

# -- data -------------------------------------------------------------------------------------------

DATA = [
    ("malformed JSON line", b'{"prompt": "a"}\n{"prompt": \n', {}, r":2: invalid JSON"),
    ("trailing garbage", b'{"prompt": "a"} tail\n', {}, r":1: invalid JSON .*trailing characters"),
    ("invalid UTF-8", b'{"prompt": "a\xff"}\n', {}, r":1: invalid JSON .*UTF-8"),
    ("non-object row", b'["a", "b"]\n', {}, r":1: expected a JSON object, got list"),
    (
        "missing input key",
        b'{"question": "a"}\n',
        {},
        r":1: missing key 'prompt' \(--input-key\); keys present: \['question'\]",
    ),
    (
        "prompt of wrong type",
        b'{"prompt": 5}\n',
        {},
        r":1: key 'prompt' \(--input-key\) must be a non-empty string, got int 5",
    ),
    ("blank prompt", b'{"prompt": "a"}\n{"prompt": "  "}\n', {}, r":2: .*got the blank string"),
    (
        "bad metadata",
        b'{"prompt": "a", "meta": [1]}\n',
        {"metadata_key": "meta"},
        r":1: key 'meta' \(--metadata-key\) must be an object, got list \[1\]",
    ),
    ("empty file", b"", {}, r"no usable prompt rows: the file is empty or blank \(--prompt-data\)"),
    (
        "every line bad, skipped",
        b"x\ny\n",
        {"on_bad_data": "skip"},
        r"no usable prompt rows: all 2 non-blank lines are bad",
    ),
]


@pytest.mark.parametrize("content, kwargs, pattern", [d[1:] for d in DATA], ids=[d[0] for d in DATA])
def test_bad_data_names_file_and_line(tmp_path, content, kwargs, pattern):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(str(path)) + ".*" + pattern):
        load_jsonl_prompts(path, **kwargs)


def test_a_bad_line_says_how_to_skip_and_a_bom_is_accepted(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\n{"prompt": 1}\n')
    with pytest.raises(DataError, match="use --on-bad-data skip"):
        load_jsonl_prompts(path)
    assert load_jsonl_prompts(path, on_bad_data="skip") == ([PromptRow(index=0, prompt="a")], 1)


@pytest.mark.parametrize("kind", ["missing file", "directory"])
def test_a_missing_or_directory_data_path_names_the_flag(tmp_path, kind):
    path = tmp_path / "evals"
    if kind == "directory":
        path.mkdir()
    with pytest.raises(
        DataError,
        match=f"{path}: {'is a directory' if kind == 'directory' else 'prompt file not found'}.*--eval-prompt-data",
    ):
        load_jsonl_prompts(path, flag="--eval-prompt-data")


# -- configuration and flags ------------------------------------------------------------------------

FLAGS = [
    (["--rollout-batch-size", "0"], "--rollout-batch-size=0 is invalid: expected >= 1"),
    (
        ["--rollout-batch-size", "8", "--over-sampling-batch-size", "4"],
        "--over-sampling-batch-size=4 is invalid: expected >= --rollout-batch-size (8)",
    ),
    (
        ["--global-batch-size", "48", "--micro-batch-size", "8"],
        "--global-batch-size=48 must divide --rollout-batch-size x --n-samples-per-prompt = 16 x 8 = 128",
    ),
    (["--micro-batch-size", "256"], "--micro-batch-size=256 is invalid: expected <= --global-batch-size (128)"),
    (["--rollout-top-p", "1.5"], "--rollout-top-p=1.5 is invalid"),
    (["--rollout-temperature", "0"], "--rollout-temperature=0.0 is invalid: expected > 0 for RL"),
    (["--max-staleness", "-1"], "--max-staleness=-1 is invalid"),
    (["--request-timeout-s", "0"], "--request-timeout-s=0.0 is invalid"),
    (["--metrics-port", "70000"], "--metrics-port=70000 is invalid: expected in [0, 65535]"),
    (["--eps-clip-c", "0.5"], "--eps-clip-c=0.5 is invalid: expected > 1"),
    (["--use-tis", "--mis-level", "token"], "--use-tis / --mis-level / --use-decoupled-ppo"),
    (["--tis-clip-low", "3"], "--tis-clip-low=3.0 is invalid: expected in [0, --tis-clip=2.0]"),
    (["--rollout-num-engines", "0"], "--rollout-num-engines=0 is invalid"),
]


@pytest.mark.parametrize("argv, message", FLAGS, ids=[a[0] for a, _ in FLAGS])
def test_an_invalid_value_names_its_flag(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_args(build_parser().parse_args(argv))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rollout-mode", "bogus"], "argument --rollout-mode: invalid choice: 'bogus'"),
        (["--n-samples-per-prompt", "abc"], "argument --n-samples-per-prompt: invalid int value: 'abc'"),
        (["--rollout-batchsize", "4"], "unrecognized arguments: --rollout-batchsize"),
    ],
)
def test_a_malformed_flag_is_refused_by_name(capsys, argv, message):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(
        b"\x02\x00\x00\x00\x00\x00\x00\x00{}"
    )  # no tensors: an 8-byte length and a 2-byte header
    return str(d)


def _broken_plugin(tmp_path, monkeypatch) -> str:
    (tmp_path / "broken_plugin.py").write_text("def keep(group):\n    return True\nundefined_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "broken_plugin.keep"


PREFLIGHT = [
    (
        "hf checkpoint missing",
        lambda t, m, mp: ["--hf-checkpoint", str(t / "nope")],
        r"--hf-checkpoint='.*nope': no such directory",
    ),
    (
        "hf checkpoint is a file",
        lambda t, m, mp: ["--hf-checkpoint", m + "/config.json"],
        r"--hf-checkpoint=.*: is a file",
    ),
    (
        "no config.json",
        lambda t, m, mp: ["--hf-checkpoint", str(t)],
        r"--hf-checkpoint=.*: no config.json in the directory",
    ),
    (
        "ref-load no config.json",
        lambda t, m, mp: ["--hf-checkpoint", m, "--ref-load", str(t)],
        r"--ref-load=.*: no config.json",
    ),
    (
        "prompt data missing",
        lambda t, m, mp: ["--hf-checkpoint", m, "--prompt-data", str(t / "p.jsonl"), "--rm-type", "arith"],
        r"--prompt-data=.*p.jsonl': no such JSONL file",
    ),
    (
        "rm module missing",
        lambda t, m, mp: ["--hf-checkpoint", m, "--custom-rm-path", "no_such_mod.reward"],
        r"--custom-rm-path='no_such_mod.reward': cannot import module 'no_such_mod'",
    ),
    (
        "rm function missing",
        lambda t, m, mp: ["--hf-checkpoint", m, "--custom-rm-path", "slime.data.arith.nope"],
        r"--custom-rm-path=.*: module 'slime.data.arith' has no callable 'nope'",
    ),
    (
        "rm path without module",
        lambda t, m, mp: ["--hf-checkpoint", m, "--custom-rm-path", "reward"],
        r"--custom-rm-path='reward': expected 'package.module.function'",
    ),
    (
        "filter module raises",
        lambda t, m, mp: ["--hf-checkpoint", m, "--dynamic-sampling-filter-path", _broken_plugin(t, mp)],
        r"--dynamic-sampling-filter-path=.*raised NameError: name 'undefined_name'",
    ),
    (
        "rollout function missing",
        lambda t, m, mp: ["--hf-checkpoint", m, "--rollout-function-path", "slime.data.arith.nope"],
        r"--rollout-function-path=.*has no callable 'nope'",
    ),
    (
        "rollout function with APRIL",
        lambda t, m, mp: ["--hf-checkpoint", m, "--rollout-function-path", "m.f", "--partial-rollout"],
        r"--rollout-function-path=m.f with --rollout-mode april",
    ),
    (
        "buffer filter not callable",
        lambda t, m, mp: ["--hf-checkpoint", m, "--buffer-filter-path", "slime.cli.preflight.DEFAULT_CHECKPOINT"],
        r"--buffer-filter-path=.*has no callable 'DEFAULT_CHECKPOINT'",
    ),
]


@pytest.mark.parametrize("make_argv, pattern", [p[1:] for p in PREFLIGHT], ids=[p[0] for p in PREFLIGHT])
def test_slime_train_checks_paths_and_plugins_at_start(tmp_path, model_dir, monkeypatch, capsys, make_argv, pattern):
    assert slime_main(["train", "--save", str(tmp_path / "run"), *make_argv(tmp_path, model_dir, monkeypatch)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slime train: error: ") and re.search(pattern, err), err
    assert not (tmp_path / "run").exists()


# -- reward, generate and filter plugins -------------------------------------------------------------


async def _hang(_):
    await asyncio.sleep(10)


async def _raiser(_):
    raise ValueError("no answer found")


REWARDS = [  # a plain function (the lambdas) runs in a worker thread, an async one on the loop
    ("raises", _raiser, "ValueError", "no answer found"),
    ("hangs", _hang, "TimeoutError", "reward timed out after 0.05s (--reward-timeout-s)"),
    ("NaN", lambda s: math.nan, "PluginError", "reward function returned non-finite nan"),
    ("string", lambda s: "1.0", "PluginError", "reward function returned str '1.0', expected a float"),
    ("bool", lambda s: True, "PluginError", "reward function returned bool True, expected a float"),
]


@pytest.mark.parametrize("fn, error_type, message", [r[1:] for r in REWARDS], ids=[r[0] for r in REWARDS])
async def test_a_failing_reward_marks_the_sample_failed_and_logs_group_and_index(caplog, fn, error_type, message):
    sample = Sample(prompt_ids=[1], group_id=7, index=3, status=Status.COMPLETED)
    with caplog.at_level(logging.WARNING, logger="slime.rollout.rewards"):
        await score_sample(sample, fn, timeout_s=0.05)
    err = sample.evidence["reward_error"]
    assert sample.status is Status.FAILED and sample.reward == 0.0
    assert (err["type"], err["message"], err["where"]) == (error_type, message, "group 7 sample 3")
    assert "reward failed for group 7 sample 3" in caplog.text and message in caplog.text


@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda samples: [1.0, 0.0], "group reward function returned 2 rewards for 3 samples"),
        (lambda samples: 1.0, "group reward function returned float 1.0, expected a list of 3 rewards"),
        (lambda samples: [1.0, "x", 0.0], "reward function returned str 'x', expected a float"),
    ],
    ids=["wrong count", "not a list", "wrong element type"],
)
async def test_a_group_reward_of_the_wrong_shape_fails_every_sample_of_the_group(caplog, fn, message):
    samples = [Sample(prompt_ids=[1], group_id=4, index=i, status=Status.COMPLETED) for i in range(3)]
    await score_group(samples, fn, timeout_s=1.0)
    assert all(s.status is Status.FAILED and s.evidence["reward_error"]["message"] == message for s in samples)
    assert all(f"group 4 sample {i}" in caplog.text for i in range(3))


async def _run_one_batch(**kw):
    async def reward(s):
        return 1.0

    async with asyncio.TaskGroup() as tg:
        sched = Scheduler(
            LoopConfig(mode="sync", rollout_batch_size=1),
            RolloutConfig(n_samples_per_prompt=2),
            source=PromptSource([PromptRow(index=0, prompt="p")], shuffle=False),
            tokenize=lambda t: [1, 2],
            decode=lambda ids: "",
            pool=FakePool(),
            buffer=DataBuffer(),
            reward_fn=reward,
            task_group=tg,
            **kw,
        )
        await sched.next_batch(1)


async def test_a_generate_plugin_returning_the_wrong_type_names_group_and_sample():
    async def bad_generate(sample, params, **kw):
        return "text"

    with pytest.raises(ExceptionGroup) as info:
        await _run_one_batch(generate_fn=bad_generate)
    exc = info.value.exceptions[0]
    assert isinstance(exc, PluginError) and re.match(
        r"generate function returned str for group 0 sample [01]; expected", str(exc)
    )


async def test_a_dynamic_sampling_filter_returning_a_non_bool_names_the_flag_and_group():
    with pytest.raises(ExceptionGroup) as info:
        await _run_one_batch(group_filter=lambda g: "yes")
    assert (
        str(info.value.exceptions[0]) == "--dynamic-sampling-filter-path returned str 'yes' for group 0, expected bool"
    )


def test_a_finished_run_without_checkpoints_is_never_overwritten_by_a_load_of_it(tmp_path, model_dir):
    import shutil

    import torch

    from slime.cli import check_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "step", "step": 1}\n')
    parse = lambda *a: config_from_args(build_parser().parse_args(list(a)))  # noqa: E731
    with pytest.raises(
        ConfigError, match=r"already holds a run .*; it has no checkpoint to resume \(it ran without --save-interval\)"
    ):
        check_run_dir(parse("--save", str(run)))
    with pytest.raises(ConfigError, match=r"--load=.*that run has no checkpoint .* nothing to resume"):
        check_run_dir(parse("--save", str(run), "--load", str(run)))
    ckpt = run / "checkpoints" / "step_000001"  # a complete checkpoint (slime.loop.resume.checkpoint_problem)
    shutil.copytree(model_dir, ckpt / "model")
    (ckpt / "loop.json").write_text('{"step": 1, "policy_version": 1, "source": {}}')
    torch.save({}, ckpt / "trainer.pt")
    (run / "checkpoints" / "latest").write_text("step_000001")
    with pytest.raises(ConfigError, match=r"resume it with --load"):
        check_run_dir(parse("--save", str(run)))


def test_slime_errors_raised_inside_task_groups_are_reported_as_one_line():
    from slime.errors import first_slime_error

    inner = PluginError("generate function broke its contract")
    group = ExceptionGroup("outer", [ValueError("x"), ExceptionGroup("inner", [inner])])
    assert first_slime_error(group) is inner
    assert first_slime_error(ExceptionGroup("g", [ValueError("x")])) is None
    assert isinstance(first_slime_error(ExceptionGroup("g", [ConfigError("c")])), ConfigError)


def test_slime_rollout_names_itself_in_its_errors(capsys):
    from slime.cli import main

    assert main(["rollout", "--rollout-batch-size", "0"]) == 2
    assert capsys.readouterr().err.startswith("slime rollout: error: --rollout-batch-size=0")
