"""The top-level ``slime`` command: help with a line per command, unknown commands named, ``--version``,
``slime bench`` / ``slime engine`` / ``slime bench rollout`` help, and the default run directory's message."""

from __future__ import annotations

import importlib.metadata

import pytest

from slime.cli import COMMANDS, main


def test_help_describes_every_command_in_one_line_and_exits_zero(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        (line,) = [line for line in out.splitlines() if line.startswith(f"  {name} ")]
        assert len(line.split(maxsplit=1)[1]) > 20  # a description, not the name alone
    assert "slime COMMAND --help" in out


@pytest.mark.parametrize(("argv", "problem"), [(["nonsense"], "unknown command 'nonsense'"), ([], "no command given")])
def test_an_unknown_or_missing_command_is_named_with_the_usage_and_exits_2(capsys, argv, problem):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"slime: error: {problem} (choose from train, rollout, engine,") and "  train " in err


def test_version_prints_the_installed_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"slime {importlib.metadata.version('slime')}\n"


def test_bench_help_exits_zero_and_an_unknown_benchmark_is_named(capsys):
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: slime bench {rollout,learning}") and "slime bench rollout --help" in out
    assert main(["bench", "nope"]) == 2
    assert capsys.readouterr().err.startswith("slime bench: error: unknown benchmark 'nope'")


def test_engine_help_mentions_sim(capsys):
    with pytest.raises(SystemExit) as info:
        main(["engine", "--help"])
    assert info.value.code == 0
    assert "slime engine --sim serves a simulated engine" in " ".join(capsys.readouterr().out.split())


def test_bench_rollout_help_states_the_simulated_train_step_and_the_run_time(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "rollout", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--train-s 45 engine seconds = 15 wall seconds at --time-scale 3" in out
    assert (
        "A default run (10 steps x 3 modes, then the overhead measurements) takes about 20 minutes; --steps 2 still takes about 5"
        in out
    )


def test_a_used_default_run_dir_is_named_as_the_default_used_without_save(tmp_path, monkeypatch):
    from slime.cli import check_run_dir
    from slime.cli.args import build_parser, config_from_args
    from slime.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "latest").mkdir(parents=True)
    (tmp_path / "runs" / "latest" / "metrics.jsonl").write_text('{"kind": "step", "step": 1}\n')
    parse = lambda *a: config_from_args(build_parser().parse_args(list(a)))  # noqa: E731
    with pytest.raises(ConfigError) as info:
        check_run_dir(parse())
    assert str(info.value) == (
        "'runs/latest', the run directory used when --save is not given, already holds a run (metrics.jsonl / summary.json); "
        "it has no checkpoint to resume (it ran without --save-interval), or pass --save DIR to start a new run in another "
        "directory (e.g. --save runs/run2)"
    )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"^--save='other' already holds a run"):
        check_run_dir(parse("--save", "other"))
    check_run_dir(parse("--save", "runs/run2"))


def test_slime_rollout_ends_saying_nothing_trained(tmp_path, capsys):
    """The end line of a rollout-only run comes from format_done_line: no claim about trained samples."""
    argv = [
        "rollout",
        "--num-rollout",
        "1",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "4",
    ]
    assert main([*argv, "--num-eval-prompts", "4", "--save", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| rollout only, step" in out and "nothing trained (rollout only)" in out and "loss" not in out
    from slime.loop.record import load_rollout_record

    # kept by default (issue 31): JSON lines in the run folder, read back by the project's own loader
    kept = load_rollout_record(str(tmp_path / "run" / "rollouts" / "rollout_{rollout_id}.jsonl"), 1)
    assert len(kept.groups) == 2 and all(len(g.samples) == 2 for g in kept.groups)
