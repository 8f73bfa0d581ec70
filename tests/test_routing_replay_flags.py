"""``--use-rollout-routing-replay`` (THUDM/slime's flag) at the CLI: what it needs is checked at ``--dry-run``, the
SGLang servers slime launches get ``--enable-return-routed-experts`` exactly once, and the client asks for routes."""

from __future__ import annotations

import json
import shlex

import pytest

from slime.cli import main
from slime.cli.args import build_parser, config_from_args, split_passthrough
from slime.config import RolloutConfig
from slime.engines.protocol import build_generate_payload, parse_generate_response
from slime.errors import ConfigError

MEGATRON = ["--train-backend", "megatron", "--use-rollout-routing-replay"]
SGLANG = ["--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "1"]


def _config(argv: list[str]):
    rest, sglang, router = split_passthrough(argv)
    return config_from_args(build_parser().parse_args(rest), sglang_args=sglang, router_args=router)


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--train-backend", "torch"], "--train-backend torch"),
        (["--sequence-parallel"], "--sequence-parallel"),
        (["--context-parallel-size", "2"], "--context-parallel-size 2"),
        (["--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel-size 2"),
    ],
)
def test_what_replay_cannot_run_with_is_an_error_naming_it(extra, named):
    with pytest.raises(ConfigError, match=f"--use-rollout-routing-replay with {named}"):
        _config([*MEGATRON, *extra])


def test_launched_sglang_servers_get_the_return_flag_once_whether_or_not_it_is_given():
    flag = "--enable-return-routed-experts"
    assert _config([*MEGATRON, *SGLANG]).engine.sglang_args.count(flag) == 1
    assert _config([*MEGATRON, *SGLANG, "--sglang-enable-return-routed-experts"]).engine.sglang_args.count(flag) == 1
    assert flag not in _config(SGLANG).engine.sglang_args  # off without the flag
    assert _config(MEGATRON).engine.sglang_args == ()  # embedded engines: nothing to pass (they answer routes anyway)


def test_dry_run_prints_the_flag_on_each_server_command_and_refuses_a_dense_model(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # a checkpoint of another machine (not here): planned, its model checked where it runs
    assert main(["train", "--dry-run", "--hf-checkpoint", str(tmp_path / "elsewhere"), *MEGATRON, *SGLANG]) == 0
    servers = [shlex.split(line) for line in capsys.readouterr().out.splitlines() if "sglang.launch_server" in line]
    assert len(servers) == 2 and all(argv.count("--enable-return-routed-experts") == 1 for argv in servers)
    for name, hf, rc in (
        ("dense", {"model_type": "llama"}, 2),
        ("moe", {"model_type": "glm4_moe", "n_routed_experts": 8}, 0),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(hf))
        code = main(["train", "--dry-run", "--hf-checkpoint", str(tmp_path / name), *MEGATRON])
        err = capsys.readouterr().err
        assert ("--use-rollout-routing-replay needs an MoE model" in err) == (rc == 2), err
    assert code == 2  # the MoE one passes this check and stops at its missing weights


def test_the_request_asks_for_routes_and_the_answer_keeps_them():
    assert "return_routed_experts" not in build_generate_payload([1, 2], {}, rid=None, return_logprob=True)
    assert build_generate_payload([1, 2], {}, rid=None, return_logprob=True, return_routed_experts=True)[
        "return_routed_experts"
    ]
    body = json.dumps(
        {"output_ids": [7], "meta_info": {"id": "r", "finish_reason": {"type": "length"}, "routed_experts": "AAAA"}}
    )
    (result,) = parse_generate_response(body, url="http://x", return_logprob=False)
    assert result.routed_experts == "AAAA" and RolloutConfig().use_rollout_routing_replay is False


def test_a_finished_answer_without_routes_is_an_error_an_aborted_one_is_not():
    from slime.engines.protocol import FinishReason, GenerateResult, with_routed_experts
    from slime.errors import ProtocolError

    def answer(finish: str) -> GenerateResult:
        return GenerateResult(output_ids=[5], output_logprobs=[0.0], finish_reason=FinishReason(type=finish))

    with pytest.raises(ProtocolError, match="--enable-return-routed-experts"):
        with_routed_experts(answer("stop"), url="http://x")
    assert with_routed_experts(answer("abort"), url="http://x").routed_experts is None  # resumed: the next request's


def test_a_teachers_pool_asks_no_routes():  # slime.engines.fleet.start: the actor's experts only are replayed
    assert RolloutConfig(use_rollout_routing_replay=True).without_routes == RolloutConfig()
