"""Plugin mistakes surface at ``slime train --dry-run`` and before a real run starts its engines
(``slime.cli.check_plugins``), and plugin paths name a module, a module in the current folder or a file
(``slime.rollout.rewards.load_function``); issue 31, items 5 and 6."""

from __future__ import annotations

import logging
import sys
import textwrap

import pytest

from slime.cli import main


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tests.fixtures.tiny_model import write_tiny_llama

    return str(write_tiny_llama(tmp_path_factory.mktemp("m") / "model", seed=0, with_tokenizer=True))


def _plugin(tmp_path, body: str, name: str = "plugin_mod") -> str:
    """``tmp_path/NAME.py`` holding ``body``; its ``file.py:`` prefix."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return f"{path}:"


def _dry_run(model: str, *flags: str) -> int:
    return main(["train", "--dry-run", "--hf-checkpoint", model, *flags])


def test_a_slime_style_reward_is_refused_at_dry_run_with_the_fix(model, tmp_path, capsys):
    spec = _plugin(tmp_path, "async def rm(args, sample, **kwargs):\n    return 1.0\n") + "rm"
    assert _dry_run(model, "--custom-rm-path", spec) == 2
    err = capsys.readouterr().err
    assert f"--custom-rm-path={spec!r} does not accept (sample)" in err
    assert "drop args" in err and f"slime check-plugin {spec} --kind reward" in err


def test_a_reward_returning_a_bool_is_refused_at_dry_run(model, tmp_path, capsys):
    spec = _plugin(tmp_path, "async def rm(sample):\n    return sample.response.endswith(sample.label)\n") + "rm"
    assert _dry_run(model, "--custom-rm-path", spec) == 2
    assert "returned bool True, expected a finite float" in capsys.readouterr().err


def test_a_reward_of_the_wrong_arity_is_refused_at_dry_run(model, tmp_path, capsys):
    spec = _plugin(tmp_path, "async def rm(sample, label):\n    return 1.0\n") + "rm"
    assert _dry_run(model, "--custom-rm-path", spec) == 2
    assert "does not accept (sample)" in capsys.readouterr().err


def test_a_dict_reward_without_reward_key_is_refused_and_with_it_passes(model, tmp_path, capsys):
    spec = _plugin(tmp_path, "async def rm(sample):\n    return {'score': 1.0}\n") + "rm"
    assert _dry_run(model, "--custom-rm-path", spec) == 2
    assert "--reward-key" in capsys.readouterr().err
    assert _dry_run(model, "--custom-rm-path", spec, "--reward-key", "score") == 0


def test_a_reward_that_raises_on_the_synthetic_sample_is_a_warning_only(model, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="slime.cli")
    spec = _plugin(tmp_path, "def rm(sample):\n    return float(sample.label['answer'])\n") + "rm"
    assert _dry_run(model, "--custom-rm-path", spec) == 0
    assert "raised TypeError" in caplog.text and "the run goes on" in caplog.text


def test_a_hanging_reward_is_given_up_on_within_the_bound(model, tmp_path, caplog, monkeypatch):
    import slime.cli.check_plugins

    monkeypatch.setattr(slime.cli.check_plugins, "PROBE_TIMEOUT_S", 0.2)  # the bound, shortened (not the check)
    caplog.set_level(logging.WARNING, logger="slime.cli")
    spec = _plugin(tmp_path, "import asyncio\nasync def rm(sample):\n    await asyncio.sleep(30)\n") + "rm"
    assert _dry_run(model, "--custom-rm-path", spec) == 0
    assert "did not return within 0.2s" in caplog.text


def test_a_bad_reward_stops_a_real_run_before_any_engine_starts(model, tmp_path, capsys, monkeypatch):
    import slime.cli

    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr(slime.cli, "_start_run", lambda *a, **k: started.append(1))  # would start the engines
    spec = _plugin(tmp_path, "async def rm(args, sample, **kwargs):\n    return 1.0\n") + "rm"
    assert main(["train", "--hf-checkpoint", model, "--custom-rm-path", spec]) == 2
    assert "does not accept (sample)" in capsys.readouterr().err and not started


def test_a_sync_generate_function_and_a_non_bool_filter_are_refused(model, tmp_path, capsys):
    gen = _plugin(tmp_path, "def gen(sample, sampling_params, **kwargs):\n    return sample\n", "gen_mod") + "gen"
    assert _dry_run(model, "--custom-generate-function-path", gen) == 2
    assert "is not async" in capsys.readouterr().err
    keep = _plugin(tmp_path, "def keep(group):\n    return 1\n", "filt_mod") + "keep"
    assert _dry_run(model, "--dynamic-sampling-filter-path", keep) == 2
    assert "expected bool" in capsys.readouterr().err


def test_a_reward_module_in_the_current_folder_is_found(model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_reward_31", raising=False)
    (tmp_path / "my_reward_31.py").write_text("async def exact_answer(sample):\n    return 1.0\n")
    assert _dry_run(model, "--custom-rm-path", "my_reward_31.exact_answer") == 0


def test_a_module_not_found_suggests_the_file_form(model, capsys):
    assert _dry_run(model, "--custom-rm-path", "no_such_reward_31.exact_answer") == 2
    assert "a function in a file is named by its path: path/to/no_such_reward_31.py:exact_answer" in (
        capsys.readouterr().err
    )
