"""``slime train --dry-run`` with THUDM/slime's Qwen3-4B launch flags (scripts/run-qwen3-4B.sh).

The flags this slime has are kept as the script writes them; ``--rollout-num-gpus 8`` stands in for
``--actor-num-nodes 1 --actor-num-gpus-per-node 8`` (accepted too: tests/engines/fleet/test_placement.py),
and ``--eval-prompt-data`` takes slime's ``name path`` pairs. Every ``--sglang-*``
flag must reach each ``sglang.launch_server`` command unchanged, prefix stripped; every flag this
slime does not know must stop the run with an error naming it.
"""

from __future__ import annotations

import shlex

import pytest

from slime.cli import main

QWEN3_4B = [
    # CKPT_ARGS
    "--hf-checkpoint",
    "/root/Qwen3-4B",
    "--ref-load",
    "/root/Qwen3-4B_torch_dist",
    "--load",
    "/root/Qwen3-4B_slime/",
    "--save",
    "/root/Qwen3-4B_slime/",
    "--save-interval",
    "20",
    # ROLLOUT_ARGS (--balance-data, --optimizer and the MISC_ARGS: tests/test_slime_scripts.py)
    "--prompt-data",
    "/root/dapo-math-17k/dapo-math-17k.jsonl",
    "--input-key",
    "prompt",
    "--label-key",
    "label",
    "--rm-type",
    "deepscaler",
    "--apply-chat-template",
    "--rollout-shuffle",
    "--num-rollout",
    "3000",
    "--rollout-batch-size",
    "32",
    "--n-samples-per-prompt",
    "8",
    "--rollout-max-response-len",
    "8192",
    "--rollout-temperature",
    "0.8",
    "--global-batch-size",
    "256",
    # EVAL_ARGS
    "--eval-interval",
    "20",
    "--eval-prompt-data",
    "aime",
    "/root/aime-2024/aime-2024.jsonl",
    "--n-samples-per-eval-prompt",
    "16",
    # PERF_ARGS
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
    "--use-dynamic-batch-size",
    "--max-tokens-per-gpu",
    "9216",
    # GRPO_ARGS
    "--advantage-estimator",
    "grpo",
    "--use-kl-loss",
    "--kl-loss-coef",
    "0.00",
    "--kl-loss-type",
    "low_var_kl",
    "--entropy-coef",
    "0.00",
    "--eps-clip",
    "0.2",
    "--eps-clip-high",
    "0.28",
    # OPTIMIZER_ARGS
    "--lr",
    "1e-6",
    "--lr-decay-style",
    "constant",
    "--weight-decay",
    "0.1",
    "--adam-beta1",
    "0.9",
    "--adam-beta2",
    "0.98",
    # SGLANG_ARGS, and the GPUs of --actor-num-gpus-per-node 8 --colocate
    "--rollout-num-gpus-per-engine",
    "2",
    "--sglang-mem-fraction-static",
    "0.7",
    "--rollout-num-gpus",
    "8",
    "--colocate",
]
MORE_SGLANG = [
    "--sglang-enable-memory-saver",
    "--sglang-chunked-prefill-size",
    "-1",
    "--sglang-cuda-graph-bs",
    "1",
    "2",
    "4",
    "8",
    "--sglang-json-model-override-args",
    '{"rope_scaling": {"type": "yarn", "factor": 4.0}}',
    "--sglang-log-level=warning",
]
EXPECTED_TAIL = [
    "--mem-fraction-static",
    "0.7",
    "--enable-memory-saver",
    "--chunked-prefill-size",
    "-1",
    "--cuda-graph-bs",
    "1",
    "2",
    "4",
    "8",
    "--json-model-override-args",
    '{"rope_scaling": {"type": "yarn", "factor": 4.0}}',
    "--log-level=warning",
]
UNSUPPORTED = [  # flags this slime does not have (--balance-data, --optimizer, dropouts...: tests/test_slime_scripts.py)
    ["--sglang-router-request-timeout-secs", "14400"],
    ["--no-such-flag"],
]


def test_dry_run_prints_every_sglang_command_with_the_sglang_flags_unchanged(capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main(["train", "--dry-run", *QWEN3_4B, *MORE_SGLANG]) == 0
    out = capsys.readouterr().out
    servers = [shlex.split(line) for line in out.splitlines() if "sglang.launch_server" in line]
    assert len(servers) == 4  # 8 GPUs / 2 per engine
    for i, argv in enumerate(servers):
        assert argv[0] == f"CUDA_VISIBLE_DEVICES={2 * i},{2 * i + 1}"
        start = argv.index("--weight-version")
        assert argv[argv.index("--model-path") + 1] == "/root/Qwen3-4B" and argv[argv.index("--tp-size") + 1] == "2"
        assert argv[start + 1] == "0" and argv[start + 2 :] == EXPECTED_TAIL
    (router,) = [shlex.split(line) for line in out.splitlines() if "sglang_router.launch_router" in line]
    urls = router[router.index("--worker-urls") + 1 : router.index("--host")]
    assert urls == [f"http://127.0.0.1:{argv[argv.index('--port') + 1]}" for argv in servers]


def test_router_flags_pass_through_to_the_router_command(capsys):
    assert (
        main(["train", "--dry-run", *QWEN3_4B, "--router-policy", "manual", "--router-health-check-interval-secs", "5"])
        == 0
    )
    (router,) = [line for line in capsys.readouterr().out.splitlines() if "sglang_router.launch_router" in line]
    assert shlex.split(router)[-4:] == ["--policy", "manual", "--health-check-interval-secs", "5"]


@pytest.mark.parametrize("extra", UNSUPPORTED, ids=lambda e: e[0])
def test_a_flag_this_slime_does_not_have_is_an_error_naming_it(capsys, extra):
    try:
        rc = main(["train", "--dry-run", *QWEN3_4B, *extra])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    assert rc == 2
    assert extra[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, hint",
    [
        ("--sglang-tp-size", "--rollout-num-gpus-per-engine"),
        ("--sglang-port", "its own port"),
        ("--router-port", "--sglang-router-port"),
    ],
)
def test_a_pass_through_flag_slime_sets_itself_is_refused_with_what_to_use(capsys, flag, hint):
    assert main(["train", "--dry-run", *QWEN3_4B, flag, "3"]) == 2
    err = capsys.readouterr().err
    assert flag in err and hint in err


def test_sglang_flags_without_sglang_servers_are_an_error_not_ignored(capsys):
    assert main(["train", "--dry-run", "--sglang-mem-fraction-static", "0.7"]) == 2
    assert "--mem-fraction-static" in capsys.readouterr().err


def test_dry_run_includes_the_server_groups_of_sglang_config(tmp_path, capsys):
    path = tmp_path / "groups.yaml"
    path.write_text(
        "groups:\n  - {name: actor, num_engines: 2}\n  - {name: teacher, model: teacher, model_path: /ckpt/t, gpus_per_engine: 2}\n"
    )
    assert (
        main(
            [
                "train",
                "--dry-run",
                "--hf-checkpoint",
                "/ckpt/p",
                "--sglang-config",
                str(path),
                "--sglang-mem-fraction-static",
                "0.6",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "[server actor-1] model=actor" in out and "[server teacher-0] model=teacher" in out
    assert out.count("--mem-fraction-static 0.6") == 3
    (router,) = [
        line for line in out.splitlines() if "sglang_router.launch_router" in line
    ]  # the teacher's one server needs none
    assert router.count("--worker-urls") == 1 and "# model 'teacher': one server, no router" in out


# --dry-run's input checks (slime.cli.preflight.check_inputs): what needs no engine fails before the plan is printed


def _model(tmp_path):
    from tests.fixtures.tiny_model import write_tiny_llama

    return str(write_tiny_llama(tmp_path / "model", seed=0, with_tokenizer=True))


def test_dry_run_plans_a_missing_hf_checkpoint_with_a_note_and_a_real_run_refuses_it(tmp_path, capsys):
    """A path of another machine (a launch script's ``/root/...``) is named in one note line and planned anyway
    (issue 31); the real run's checks refuse it (tests/test_slime_scripts.py runs whole scripts so)."""
    assert main(["train", "--dry-run", "--hf-checkpoint", str(tmp_path / "nope")]) == 0
    captured = capsys.readouterr()
    assert (
        f"note: not on this machine, planned anyway (a real run refuses them): --hf-checkpoint {tmp_path / 'nope'}\n"
        in captured.out
        and "# slime launch plan" in captured.out
    )
    assert main(["train", "--hf-checkpoint", str(tmp_path / "nope"), "--save", str(tmp_path / "run")]) == 2
    assert f"--hf-checkpoint={str(tmp_path / 'nope')!r}: no such directory" in capsys.readouterr().err


def test_dry_run_names_the_first_bad_line_of_the_prompt_data(tmp_path, capsys):
    prompts = tmp_path / "qa.jsonl"
    prompts.write_text('{"prompt": "1+1", "label": "2"}\n{"prompt": "2+2", "label": \n')
    argv = [
        "train",
        "--dry-run",
        "--hf-checkpoint",
        _model(tmp_path),
        "--prompt-data",
        str(prompts),
        "--rm-type",
        "arith",
    ]
    assert main(argv) == 2
    assert f"{prompts}:2" in capsys.readouterr().err
    prompts.write_text('{"prompt": "1+1", "label": "2"}\n')
    assert main(argv) == 0


def test_dry_run_refuses_a_reward_module_that_does_not_import(tmp_path, capsys):
    assert (
        main(["train", "--dry-run", "--hf-checkpoint", _model(tmp_path), "--custom-rm-path", "no_such_mod.reward"]) == 2
    )
    assert "--custom-rm-path='no_such_mod.reward': cannot import module 'no_such_mod'" in capsys.readouterr().err


def test_a_run_on_the_shipped_warm_start_says_so(tmp_path, caplog, monkeypatch):
    import logging

    from slime.cli.args import build_parser, config_from_args
    from slime.cli.preflight import DEFAULT_CHECKPOINTS, check_inputs

    caplog.set_level(logging.INFO, logger="slime.cli")
    model = _model(tmp_path)
    monkeypatch.setitem(DEFAULT_CHECKPOINTS, "arith", model)  # the shipped one may not be built in this checkout
    check_inputs(config_from_args(build_parser().parse_args(["--hf-checkpoint", model])))
    assert [r.getMessage() for r in caplog.records] == [
        f"no --hf-checkpoint: using the shipped warm start of the built-in task arith ({model})"
    ]
    caplog.clear()
    check_inputs(config_from_args(build_parser().parse_args(["--hf-checkpoint", str(write_other(tmp_path))])))
    assert caplog.records == []


def write_other(tmp_path):
    from tests.fixtures.tiny_model import write_tiny_llama

    return write_tiny_llama(tmp_path / "other", seed=1, with_tokenizer=True)
