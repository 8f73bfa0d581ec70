"""``slime check-plugin`` accepts a correct generate function and names each broken contract precisely."""

from __future__ import annotations

import io
import textwrap

import pytest
import torch

from slime.config import RolloutConfig
from slime.engines.pool import HttpEnginePool
from slime.rollout.plugin_check import Report, check_filter, check_generate, check_reward, load_plugin, main
from slime.servers.embedded import EngineServer
from slime.servers.embedded.tiny import write_tiny_llama

torch.set_num_threads(1)

GOOD = """
from slime.rollout.generate import generate as default_generate

async def generate(sample, sampling_params, **kwargs):
    return await default_generate(sample, sampling_params, **kwargs)
"""
BROKEN = """
from slime.rollout.generate import generate as default_generate

async def returns_dict(sample, sampling_params, **kwargs):
    return {"tokens": [1, 2]}

async def drops_a_logprob(sample, sampling_params, **kwargs):
    await default_generate(sample, sampling_params, **kwargs)
    sample.rollout_logprobs.pop()
    return sample

async def rewrites_tokens(sample, sampling_params, **kwargs):
    had = len(sample.response_ids)
    await default_generate(sample, sampling_params, **kwargs)
    if had:
        sample.response_ids[0] += 1
    return sample

async def swallows_aborts(sample, sampling_params, **kwargs):
    await default_generate(sample, sampling_params, **kwargs)
    sample.status = type(sample.status).COMPLETED
    return sample

def not_async(sample, sampling_params, **kwargs):
    return sample

async def returns_none(sample, sampling_params, **kwargs):
    return None

async def too_long_and_from_the_future(sample, sampling_params, *, max_response_len, engine_version, **kwargs):
    n = max_response_len + 10
    sample.append([5] * n, [-0.1] * n, engine_version + 7)
    sample.status = type(sample.status).COMPLETED
    return sample

def reward_as_text(sample):
    return "1.0"

async def reward_dict(sample):
    return {"score": 0.5, "acc": True}

def sync_reward(sample):
    return 1.0

async def thudm_reward(args, sample, **kwargs):
    return 1.0

def numpy_keep(group):
    import numpy
    return numpy.bool_(True)
"""


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins")
    (root / "good.py").write_text(textwrap.dedent(GOOD))
    (root / "broken.py").write_text(textwrap.dedent(BROKEN))
    return root


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("check") / "tiny", seed=0)


@pytest.fixture
async def pool(tiny_dir):
    async with EngineServer(tiny_dir, port=0, seed=0, weight_version="0") as server:
        async with HttpEnginePool([server.url], config=RolloutConfig(request_timeout_s=30, max_retries=0)) as p:
            yield p


async def run_generate(fn, pool) -> Report:
    report = Report("generate", out=io.StringIO())
    await check_generate(fn, pool=pool, report=report, decode=lambda ids: "", timeout_s=30)
    return report


def failures(report: Report) -> list[str]:
    return [line for line in report.lines if line.startswith("FAIL")]


def test_main_accepts_a_correct_generate_function_and_exits_zero(plugins, capsys):
    assert main([f"{plugins / 'good.py'}:generate"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "PASS generate: abort mid-generation: status partial" in out
    assert "PASS generate: resume: earlier tokens kept" in out and out.rstrip().endswith("RESULT: PASS")


async def test_wrong_return_type_is_named(plugins, pool):
    report = await run_generate(load_plugin(f"{plugins / 'broken.py'}:returns_dict"), pool)
    assert failures(report) == ["FAIL generate: fresh sample: returned dict, expected Sample or list[Sample]"]


async def test_misaligned_lists_are_named_with_both_lengths(plugins, pool):
    [line] = failures(await run_generate(load_plugin(f"{plugins / 'broken.py'}:drops_a_logprob"), pool))
    n = int(line.split("response_ids has ")[1].split()[0])
    assert line == f"FAIL generate: fresh sample: response_ids has {n} tokens but rollout_logprobs has {n - 1}"


async def test_rewriting_earlier_tokens_on_resume_is_caught(plugins, pool):
    lines = failures(await run_generate(load_plugin(f"{plugins / 'broken.py'}:rewrites_tokens"), pool))
    assert lines and "resumed call: response_ids was rewritten at position 0" in lines[0]


async def test_an_abort_that_does_not_come_back_partial_is_caught(plugins, pool):
    [line] = failures(await run_generate(load_plugin(f"{plugins / 'broken.py'}:swallows_aborts"), pool))
    assert line.startswith("FAIL generate: aborted call: status is completed") and "Status.PARTIAL" in line


async def test_sync_generate_function_is_rejected(plugins, pool):
    [line] = failures(await run_generate(load_plugin(f"{plugins / 'broken.py'}:not_async"), pool))
    assert "is not async" in line


async def test_reward_must_return_a_float_and_filter_a_bool(plugins):
    reward = Report("reward", out=io.StringIO())
    await check_reward(load_plugin(f"{plugins / 'broken.py'}:reward_as_text"), report=reward)
    assert failures(reward) == ["FAIL reward: returned str '1.0', expected a finite float"]
    keep = Report("filter", out=io.StringIO())
    check_filter(load_plugin(f"{plugins / 'broken.py'}:numpy_keep"), report=keep)
    assert failures(keep)[0] == "FAIL filter: group with mixed rewards: returned numpy.bool np.True_, expected bool"


def test_unloadable_path_fails_with_the_reason(plugins, capsys):
    assert main([f"{plugins / 'good.py'}:missing", "--kind", "reward"]) == 1
    assert "has no callable 'missing'" in capsys.readouterr().out


async def test_none_over_length_and_future_versions_are_named(plugins, pool):
    report = await run_generate(load_plugin(f"{plugins / 'broken.py'}:returns_none"), pool)
    assert failures(report) == [
        "FAIL generate: fresh sample: status is still pending after the call (returned None or the "
        "sample without setting a status); set COMPLETED, TRUNCATED, PARTIAL or FAILED"
    ]
    report = await run_generate(load_plugin(f"{plugins / 'broken.py'}:too_long_and_from_the_future"), pool)
    assert failures(report) == [
        "FAIL generate: fresh sample: 34 response tokens, more than max_response_len=24",
        "FAIL generate: fresh sample: a token has policy version 7, newer than the engine's 0; tag each token with the "
        "engine_version the call was given (or the engine's weight_versions)",
    ]


def test_a_function_that_takes_the_tokenizer_gets_the_model_s_and_the_shipped_tool_generate_passes(capsys):
    from pathlib import Path

    import slime.data.calc

    warmstart = Path(slime.data.calc.__file__).parent / "assets" / "calc-warmstart"
    assert main(["slime.rollout.multiturn.calculator_generate", "--model", str(warmstart)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("RESULT: PASS")
    assert main(["slime.rollout.multiturn.calculator_generate"]) == 1  # the tiny default model has no tokenizer
    assert "takes tokenizer=: pass --model DIR" in capsys.readouterr().out


def test_train_flags_take_the_file_path_form_too(plugins):
    from slime.rollout.rewards import load_function

    assert (
        load_function(f"{plugins / 'good.py'}:generate", flag="--custom-generate-function-path").__name__ == "generate"
    )
    with pytest.raises(Exception, match=r"--custom-generate-function-path=.*has no callable 'nope'"):
        load_function(f"{plugins / 'good.py'}:nope", flag="--custom-generate-function-path")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "reward_dict",
            "FAIL generate: does not accept (sample, sampling_params, pool=, max_response_len=, engine_version=, decode=): "
            "too many positional arguments; it takes one argument (sample), like a reward function `reward(sample)`: check it with "
            "--kind reward (a dynamic-sampling filter `keep(group)`: --kind filter)",
        ),
        (
            "sync_reward",
            "FAIL generate: is not async: write `async def generate(sample, sampling_params, **kwargs)`; it takes one "
            "argument (sample), like a reward function `reward(sample)`: check it with --kind reward",
        ),
        (
            "thudm_reward",
            "FAIL generate: takes args first; a generate function is `async def generate(sample, sampling_params, "
            "**kwargs)`; it takes (args, sample), like THUDM/slime's reward functions: check it with --kind reward",
        ),
    ],
)
def test_a_reward_function_checked_as_generate_gets_a_hint_to_pass_kind_reward_without_starting_an_engine(
    plugins, capsys, name, expected
):
    assert main([f"{plugins / 'broken.py'}:{name}"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(expected) and out[1:] == ["RESULT: FAIL"]


def test_a_generate_function_gets_no_reward_hint(plugins):
    from slime.rollout.plugin_check import generate_signature_problem

    for name in ("returns_dict", "returns_none", "too_long_and_from_the_future"):
        assert generate_signature_problem(load_plugin(f"{plugins / 'broken.py'}:{name}")) is None
    assert "--kind reward" not in generate_signature_problem(load_plugin(f"{plugins / 'broken.py'}:not_async"))


def test_a_reward_returning_a_dict_needs_reward_key_as_slime_train_does(plugins, capsys):
    path = f"{plugins / 'broken.py'}:reward_dict"
    assert main([path, "--kind", "reward"]) == 1
    assert "FAIL reward: returned a dict {'score': 0.5, 'acc': True}; pass --reward-key KEY" in capsys.readouterr().out
    assert main([path, "--kind", "reward", "--reward-key", "score"]) == 0
    out = capsys.readouterr().out
    assert "PASS reward: returned 0.5 for a finished sample" in out and out.rstrip().endswith("RESULT: PASS")
    assert main([path, "--kind", "reward", "--reward-key", "nope"]) == 1
    assert "FAIL reward: returned a dict without --reward-key 'nope' (keys: 'score', 'acc')" in capsys.readouterr().out
    assert main([path, "--kind", "reward", "--reward-key", "acc"]) == 1  # a bool is not a reward, as in slime train
    assert "FAIL reward: returned bool True, expected a finite float" in capsys.readouterr().out


def test_thudm_slime_s_args_sample_reward_is_named_as_such_under_kind_reward(plugins, capsys):
    assert main([f"{plugins / 'broken.py'}:thudm_reward", "--kind", "reward"]) == 1
    out = capsys.readouterr().out
    assert (
        "FAIL reward: does not accept (sample): missing a required argument: 'sample'; slime calls a reward function"
        in out
    )
