"""``slime train --dry-run`` on the flags of THUDM/slime's launch scripts, as written: Qwen3-4B GRPO, its fully-async
example, the 0.6B single-GPU one, GLM-4-9B and Llama-3.1-8B; no check is patched away.

The flags (names and values only) are in ``tests/data/slime_scripts/``. Every one is accepted, and
none is ignored in silence: each flag of ``COMPAT_FLAGS`` logs its one line (checked or no-op),
every other one is applied (``FLAGS``). An architecture flag that disagrees with the HF config of
``--hf-checkpoint`` (a ``config.json`` and a one-tensor ``model.safetensors`` written here) is
an error naming both values. The scripts' other paths (``--ref-load /root/...``, the data) are not on this
machine: the plan names each in one note line (``slime.cli.plan_inputs``), a real run refuses them.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import save_file

from slime.cli import main
from slime.cli.args import FLAGS, build_parser, config_from_args, split_passthrough
from slime.cli.compat import COMPAT_FLAGS, Checked, NoOp, check_compat_flags
from slime.cli.preflight import check_inputs
from slime.errors import CheckpointError, ConfigError

DATA = Path(__file__).parent / "data" / "slime_scripts"

# Flags of these scripts that other items of issue 16 add (items 2-4). Until they are merged a flag
# the parser does not know yet is left out here; once merged, it is run like every other flag.
QWEN3_4B_CONFIG = {  # the architecture of Qwen/Qwen3-4B's config.json
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "max_position_embeddings": 40960,
}


def _flags(*names: str) -> list[list[str]]:
    """One token list per flag line of the data files."""
    lines = [line for name in names for line in (DATA / name).read_text().splitlines()]
    return [shlex.split(line) for line in lines if line.strip() and not line.startswith("#")]


def _runnable(flags: list[list[str]], hf_dir: Path) -> list[list[str]]:
    """The flags as ``slime train`` takes them: ``--hf-checkpoint`` is ``hf_dir``."""
    return [[flag, str(hf_dir)] if flag == "--hf-checkpoint" else [flag, *rest] for flag, *rest in flags]


def _write_hf_dir(path: Path, hf_config: dict) -> Path:
    """An HF directory as ``check_hf_dir`` accepts it: ``config.json`` and a one-tensor ``model.safetensors``."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(hf_config))
    save_file({"w": torch.zeros(1)}, str(path / "model.safetensors"))
    return path


@pytest.fixture
def hf_dir(tmp_path: Path) -> Path:
    return _write_hf_dir(tmp_path / "Qwen3-4B", QWEN3_4B_CONFIG)


SCRIPTS = {
    "qwen3-4B-grpo": ("qwen3_4b_model.txt", "run_qwen3_4b.txt"),
    "qwen3-4B-fully-async": ("qwen3_4b_model.txt", "run_qwen3_4b_fully_async.txt"),
    "qwen3-0.6B-single-gpu": ("run_qwen3_0_6b_single_gpu.txt",),
    "glm4-9B": ("run_glm4_9b.txt",),  # its MODEL_ARGS: test_glm4_layer_flags_are_checked_against_the_hf_model_type
    "llama3.1-8B": ("llama3_1_8b_model.txt", "run_llama3_1_8b.txt"),
}
HF_CONFIGS = {"llama3.1-8B": "LLAMA3_1_8B_CONFIG"}  # the others: Qwen3-4B's (GLM-4's run flags check none of it)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_of_the_script_is_accepted_and_none_is_silent(script, tmp_path, caplog, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    hf_dir = _write_hf_dir(tmp_path / "model", globals()[HF_CONFIGS.get(script, "QWEN3_4B_CONFIG")])
    flags = _flags(*SCRIPTS[script])
    runnable = _runnable(flags, hf_dir)
    caplog.set_level(logging.INFO, logger="slime.cli.compat")
    rc = main(["train", "--dry-run", *[t for tokens in runnable for t in tokens]])
    assert rc == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "sglang.launch_server" in out
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    missing = [f"{flag} {path}" for flag, *rest in runnable for path in rest[-1:] if path.startswith("/root/")]
    missing = [m for m in missing if m.split()[0] in ("--ref-load", "--prompt-data", "--eval-prompt-data")]
    assert len(notes) == 1 and all(m in notes[0] for m in missing), (notes, missing)
    known = set(build_parser()._option_string_actions)
    for tokens in flags:
        flag = tokens[0]
        if flag.startswith("--sglang-"):
            continue  # passed to SGLang unchanged (tests/test_cli_dry_run.py)
        assert flag in known, f"{flag} is not accepted"
        assert flag in FLAGS or flag in COMPAT_FLAGS, f"{flag} has no fate"
    lines = [r.getMessage() for r in caplog.records if r.name == "slime.cli.compat"]
    for tokens in runnable:
        flag = tokens[0]
        if flag in COMPAT_FLAGS:
            said = [line for line in lines if line.startswith(flag + " ") or line.startswith(flag + ":")]
            what = "no-op here: " if isinstance(COMPAT_FLAGS[flag], NoOp) else "checked: matches "
            assert len(said) == 1 and what in said[0], (flag, said)
    assert len(lines) == sum(tokens[0] in COMPAT_FLAGS for tokens in runnable)  # nothing else, nothing twice
    _assert_applied(runnable)


def _assert_applied(runnable: list[list[str]]) -> None:
    """Each ``FLAGS`` flag of the script reached its config field with the script's value."""
    argv, sglang_args, router_args = split_passthrough([t for tokens in runnable for t in tokens])
    config = msgspec.to_builtins(
        config_from_args(build_parser().parse_args(argv), sglang_args=sglang_args, router_args=router_args)
    )
    for flag, *values in runnable:
        if flag not in FLAGS or "=" in FLAGS[flag][0] or len(values) > 1:
            continue
        node = config
        for part in FLAGS[flag][0].split("."):
            node = node[part]
        want = values[0] if values else True  # a bare flag sets True
        assert node == (want if isinstance(node, (bool, str)) else type(node)(want)), (flag, node, want)


@pytest.mark.parametrize(
    "flag, value, hf_key",
    [
        ("--num-layers", "40", "num_hidden_layers = 36"),
        ("--hidden-size", "4096", "hidden_size = 2560"),
        ("--num-query-groups", "4", "num_key_value_heads = 8"),
        ("--rotary-base", "10000", "rope_theta = 1000000"),
        ("--norm-epsilon", "1e-05", "rms_norm_eps = 1e-06"),
        ("--kv-channels", "64", "head_dim = 128"),
        ("--untie-embeddings-and-output-weights", None, "tie_word_embeddings = True"),
        ("--normalization", "LayerNorm", "rms_norm_eps = 1e-06 (RMSNorm)"),
    ],
)
def test_an_architecture_flag_that_disagrees_with_the_hf_config_is_an_error(flag, value, hf_key, hf_dir, capsys):
    flags = [t for t in _flags("qwen3_4b_model.txt") if t[0] != flag]
    argv = [t for tokens in _runnable(flags + _flags("run_qwen3_4b.txt"), hf_dir) for t in tokens]
    assert main(["train", "--dry-run", *argv, flag, *([value] if value else [])]) == 2
    err = capsys.readouterr().err
    assert f"{flag}{' ' + value if value else ''} disagrees with {hf_dir / 'config.json'}: {hf_key}" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--hidden-dropout", "0.1"], "--hidden-dropout 0.1: not supported here, only 0"),
        (["--optimizer", "sgd"], "--optimizer sgd: not supported here, only adam"),
    ],
)
def test_a_no_op_flag_with_a_value_that_would_change_training_is_an_error(argv, words, capsys):
    assert main(["train", "--dry-run", *argv]) == 2
    assert words in capsys.readouterr().err


def test_an_architecture_flag_without_a_config_json_is_logged_as_not_checked(tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO, logger="slime.cli.compat")
    assert main(["train", "--dry-run", "--hf-checkpoint", str(tmp_path / "elsewhere"), "--num-layers", "36"]) == 0
    assert [r.getMessage() for r in caplog.records if r.name == "slime.cli.compat"] == [
        f"--num-layers 36: not checked: {tmp_path / 'elsewhere' / 'config.json'} not found"
    ]


def test_the_compat_table_is_pinned_and_disjoint_from_the_applied_flags():
    assert not set(COMPAT_FLAGS) & set(FLAGS)
    assert {f for f, e in COMPAT_FLAGS.items() if isinstance(e, Checked)} >= {
        "--num-layers",
        "--hidden-size",
        "--ffn-hidden-size",
        "--num-attention-heads",
        "--group-query-attention",
        "--num-query-groups",
        "--kv-channels",
        "--swiglu",
        "--rotary-base",
        "--normalization",
        "--norm-epsilon",
        "--qk-layernorm",
        "--vocab-size",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--use-rotary-position-embeddings",
        "--max-position-embeddings",
    }


# Flags of the other scripts (other_run_scripts.txt) that issue 16 item 1 added: each applied (FLAGS) or checked
# (COMPAT_FLAGS); none is refused any more.
ADDED = {
    "--tis-level",
    "--lr-warmup-fraction",
    "--rollout-max-prompt-len",
    "--deterministic-mode",  # applied
    "--skip-eval-before-train",
    "--eval-top-k",
    "--rollout-num-gpus-per-node",  # applied (eval path, placement plan)
    "--eval-config",  # applied: slime.eval_config (tests/test_eval_config.py)
    "--custom-reward-post-process-path",  # OPD example: a no-op with --use-opd, an error otherwise
    "--post-self-attn-layernorm",
    "--post-mlp-layernorm",
    "--rotary-interleaved",  # GLM-4: checked against model_type
    "--rollout-max-context-len",  # applied (multi-agent example): prompt + response cap
}
LLAMA3_1_8B_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}
QWEN3_30B_A3B_CONFIG = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "hidden_act": "silu",
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}


@pytest.mark.parametrize(
    "model, hf_config",
    [("llama3_1_8b_model.txt", LLAMA3_1_8B_CONFIG), ("qwen3_30b_a3b_model.txt", QWEN3_30B_A3B_CONFIG)],
)
def test_the_model_flags_of_other_families_match_their_hf_config(model, hf_config, tmp_path, caplog):
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    caplog.set_level(logging.INFO, logger="slime.cli.compat")
    flags = _flags(model)
    ns = build_parser().parse_args([t for tokens in flags for t in tokens])
    check_compat_flags(ns, str(tmp_path))
    lines = [r.getMessage() for r in caplog.records if r.name == "slime.cli.compat"]
    said = {line.split(":")[0].split(" ")[0] for line in lines if "checked: matches" in line or "no-op here" in line}
    assert said == {tokens[0] for tokens in flags if tokens[0] in COMPAT_FLAGS} and len(lines) == len(said)
    assert all(tokens[0] in FLAGS or tokens[0] in COMPAT_FLAGS for tokens in flags)


def test_qkv_bias_and_rope_scaling_are_checked_both_ways(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "rope_theta": 10000.0, "attention_bias": False})
    )
    for argv, words in (
        (["--add-qkv-bias"], "attention_bias = False (so --add-qkv-bias does not apply)"),
        (["--use-rope-scaling"], "rope_scaling = absent (so --use-rope-scaling does not apply)"),
    ):
        with pytest.raises(ConfigError, match=re.escape(words)):
            check_compat_flags(build_parser().parse_args(argv), str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    check_compat_flags(build_parser().parse_args(["--add-qkv-bias"]), str(tmp_path))  # Qwen2's q/k/v carry a bias


def test_every_flag_of_the_other_launch_scripts_is_accepted_and_has_a_fate():
    parser = build_parser()
    for tokens in _flags("other_run_scripts.txt"):
        flag = tokens[0]
        if flag.startswith("--sglang-"):
            continue  # passed to SGLang unchanged
        assert flag in FLAGS or flag in COMPAT_FLAGS, f"{flag} has no fate"
        parser.parse_args(tokens)  # accepted with the script's value
    assert ADDED <= set(FLAGS) | set(COMPAT_FLAGS)


GLM4_9B_0414_CONFIG = {  # the keys of THUDM/GLM-4-9B-0414's config.json that the GLM-4 flags are checked against
    "model_type": "glm4",
    "architectures": ["Glm4ForCausalLM"],
    "attention_bias": True,
    "partial_rotary_factor": 0.5,
}


def test_glm4_layer_flags_are_checked_against_the_hf_model_type(tmp_path, caplog):
    glm = [
        t
        for t in _flags("other_run_scripts.txt")
        if t[0]
        in (
            "--post-self-attn-layernorm",
            "--post-mlp-layernorm",
            "--rotary-interleaved",
            "--add-qkv-bias",
            "--rotary-percent",
        )
    ]
    assert len(glm) == 5
    (tmp_path / "config.json").write_text(json.dumps(GLM4_9B_0414_CONFIG))
    caplog.set_level(logging.INFO, logger="slime.cli.compat")
    check_compat_flags(build_parser().parse_args([t for tokens in glm for t in tokens]), str(tmp_path))
    assert sum("checked: matches" in r.getMessage() for r in caplog.records) == 5
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B_CONFIG))
    for flag in ("--post-self-attn-layernorm", "--post-mlp-layernorm", "--rotary-interleaved"):
        with pytest.raises(
            ConfigError,
            match=re.escape(
                f"{flag} disagrees with {tmp_path / 'config.json'}: model_type = qwen3 (so {flag} does not apply)"
            ),
        ):
            check_compat_flags(build_parser().parse_args([flag]), str(tmp_path))


def test_the_docs_table_names_every_flag_and_its_fate():
    doc = (Path(__file__).parents[1] / "docs" / "slime_flags.md").read_text()
    missing = [flag for flag in [*COMPAT_FLAGS, *ADDED] if f"`{flag}`" not in doc]
    assert missing == []


def test_a_config_json_value_of_the_wrong_type_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"head_dim": "wide", "text_config": {"num_hidden_layers": 36}}))
    check_compat_flags(build_parser().parse_args(["--num-layers", "36"]), str(tmp_path))  # text_config (VLMs) is read
    with pytest.raises(
        ConfigError, match=re.escape(f"{tmp_path / 'config.json'}: cannot check --kv-channels: ValueError")
    ):
        check_compat_flags(build_parser().parse_args(["--kv-channels", "128"]), str(tmp_path))


# THUDM/slime's examples/on_policy_distillation/run-qwen3-8B-opd.sh: its OPD flags (RM_ARGS, GRPO_ARGS)
OPD_EXAMPLE = [
    "--custom-rm-path",
    "examples.on_policy_distillation.on_policy_distillation.reward_func",
    "--custom-reward-post-process-path",
    "examples.on_policy_distillation.on_policy_distillation.post_process_rewards",
    "--rm-url",
    "http://127.0.0.1:13141/generate",
    "--advantage-estimator",
    "on_policy_distillation",
    "--use-kl-loss",
    "--kl-loss-coef",
    "0.00",
    "--kl-loss-type",
    "low_var_kl",
    "--entropy-coef",
    "0.00",
]


def test_the_opd_example_maps_onto_use_opd_with_its_teacher_server(caplog):
    caplog.set_level(logging.INFO, logger="slime.cli.args")
    config = config_from_args(build_parser().parse_args(OPD_EXAMPLE))
    t = config.train
    assert (t.use_opd, t.opd_only, t.opd_kl_coef, t.advantage_estimator) == (True, True, 1.0, "grpo")
    assert config.engine.opd_teacher_addrs == ("http://127.0.0.1:13141",)  # the example's teacher server
    assert (config.rollout.custom_rm_path, config.rollout.rm_url) == (
        None,
        None,
    )  # its job (asking the teacher) is OPD's here
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and lines[0].startswith(
        "--advantage-estimator on_policy_distillation: here --use-opd --opd-only"
    )
    assert (
        "--custom-reward-post-process-path examples.on_policy_distillation.on_policy_distillation.post_process_rewards: no-op"
        in lines[2]
    )
    assert main(["train", "--dry-run", *OPD_EXAMPLE]) == 0


def test_a_given_teacher_is_kept_and_no_teacher_is_an_error_naming_what_to_give():
    config = config_from_args(
        build_parser().parse_args(["--advantage-estimator", "on_policy_distillation", "--opd-teacher-addrs", "h:1"])
    )
    assert (config.train.use_opd, config.engine.opd_teacher_addrs) == (True, ("h:1",))
    with pytest.raises(
        ConfigError, match="--advantage-estimator on_policy_distillation needs a teacher: --opd-teacher-addrs"
    ):
        config_from_args(build_parser().parse_args(["--advantage-estimator", "on_policy_distillation"]))


def test_the_reward_post_process_hook_without_opd_is_an_error_naming_it():
    with pytest.raises(
        ConfigError, match="--custom-reward-post-process-path m.f: only THUDM/slime's on-policy-distillation hook"
    ):
        config_from_args(build_parser().parse_args(["--custom-reward-post-process-path", "m.f"]))


def test_a_script_as_written_plans_with_one_note_naming_each_path_not_here_and_a_real_run_refuses_them(capsys):
    flags = [t for tokens in _flags("run_glm4_9b.txt") for t in tokens]  # every path /root/..., as in the script
    assert main(["train", "--dry-run", *flags]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("note: ")] == [
        "note: not on this machine, planned anyway (a real run refuses them): --hf-checkpoint /root/GLM-Z1-9B-0414/, "
        "--ref-load /root/GLM-Z1-9B-0414_torch_dist, --prompt-data /root/dapo-math-17k/dapo-math-17k.jsonl, "
        "--eval-prompt-data /root/aime-2024/aime-2024.jsonl"
    ]
    argv, sglang_args, router_args = split_passthrough(flags)
    config = config_from_args(build_parser().parse_args(argv), sglang_args=sglang_args, router_args=router_args)
    with pytest.raises(CheckpointError, match=re.escape("--hf-checkpoint='/root/GLM-Z1-9B-0414': no such directory")):
        check_inputs(config)  # what a real run's preflight runs


def test_a_path_that_is_here_but_broken_is_still_an_error_in_a_plan(tmp_path, capsys):
    (tmp_path / "model").mkdir()  # no config.json
    assert main(["train", "--dry-run", "--hf-checkpoint", str(tmp_path / "model")]) == 2
    assert "no config.json in the directory" in capsys.readouterr().err


def test_eval_samples_without_an_eval_temperature_sample_at_the_rollout_temperature(caplog):
    caplog.set_level(logging.INFO, logger="slime.cli.args")
    argv = ["--n-samples-per-eval-prompt", "16", "--rollout-temperature", "0.8"]
    config = config_from_args(build_parser().parse_args(argv))
    assert config.rollout.eval_temperature == 0.8
    config.check_run_modes()
    assert [r.getMessage() for r in caplog.records] == [
        "--n-samples-per-eval-prompt 16 without --eval-temperature: eval samples at --rollout-temperature 0.8 "
        "(as THUDM/slime's eval; greedy samples would all be the same)"
    ]
    given = config_from_args(build_parser().parse_args([*argv, "--eval-temperature", "0"]))
    with pytest.raises(ConfigError, match=re.escape("--n-samples-per-eval-prompt=16 needs --eval-temperature > 0")):
        given.check_run_modes()  # a greedy eval asked for with 16 samples: still an error
