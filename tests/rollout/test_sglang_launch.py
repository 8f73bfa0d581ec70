"""The launch plan from ``--sglang-config`` server groups, from flags, and the YAML's errors.

Ports come from a fake ``is_free`` (every port free), so they are numbered from ``base_port`` in
plan order: servers group by group, a prefill server's bootstrap port right after its own, then
one router per model.
"""

from __future__ import annotations

import textwrap

import pytest

from slime.config import EngineConfig
from slime.errors import ConfigError
from slime.rollout.server_groups import ServerGroup, group_args
from slime.rollout.sglang_launch import build_launch_plan

PY = "python"
YAML = """\
groups:
  - {name: prefill, model: actor, role: prefill, num_engines: 1, gpus_per_engine: 2, args: {mem-fraction-static: 0.8}}
  - name: decode
    model: actor
    role: decode
    num_engines: 2
    args: {cuda-graph-max-bs: 256, enable-memory-saver: false}
  - {name: ref, model: reference, args: {mem-fraction-static: 0.3}}
  - {name: teacher, model: teacher, model_path: /ckpt/teacher-32b, gpus_per_engine: 4, args: {--quantization: fp8}}
"""


def plan_for(tmp_path, yaml_text: str, **engine):
    path = tmp_path / "sglang.yaml"
    path.write_text(textwrap.dedent(yaml_text))
    config = EngineConfig(hf_checkpoint="/ckpt/policy", sglang_config=str(path), base_port=20000,
                          sglang_args=("--mem-fraction-static", "0.7", "--enable-memory-saver"), **engine)
    return build_launch_plan(config, weight_version="3", python=PY, is_free=lambda host, port: True), path


def server(name, gpus, port, model_path, tp, version, *tail):
    head = [PY, "-m", "sglang.launch_server", "--model-path", model_path, "--host", "127.0.0.1", "--port", str(port),
            "--tp-size", str(tp), "--weight-version", version]
    return name, {"CUDA_VISIBLE_DEVICES": gpus}, (*head, *tail)


def test_groups_give_pd_servers_heterogeneous_args_several_models_and_one_router_each(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan, _ = plan_for(tmp_path, YAML, rollout_num_gpus=9, router_args=("--policy", "cache_aware"))
    assert [(s.name, s.env, s.argv) for s in plan.servers] == [
        server("prefill-0", "0,1", 20000, "/ckpt/policy", 2, "3", "--disaggregation-mode", "prefill",
               "--disaggregation-bootstrap-port", "20001", "--enable-memory-saver", "--mem-fraction-static", "0.8"),
        server("decode-0", "2", 20002, "/ckpt/policy", 1, "3", "--disaggregation-mode", "decode",
               "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "256"),
        server("decode-1", "3", 20003, "/ckpt/policy", 1, "3", "--disaggregation-mode", "decode",
               "--mem-fraction-static", "0.7", "--cuda-graph-max-bs", "256"),
        server("ref-0", "4", 20004, "/ckpt/policy", 1, "0", "--enable-memory-saver", "--mem-fraction-static", "0.3"),
        server("teacher-0", "5,6,7,8", 20005, "/ckpt/teacher-32b", 4, "0", "--mem-fraction-static", "0.7",
               "--enable-memory-saver", "--quantization", "fp8"),
    ]
    router = [PY, "-m", "sglang_router.launch_router"]
    assert [(r.model, r.url, r.argv) for r in plan.routers] == [
        ("actor", "http://127.0.0.1:20006", (*router, "--pd-disaggregation", "--prefill", "http://127.0.0.1:20000", "20001",
                                              "--decode", "http://127.0.0.1:20002", "--decode", "http://127.0.0.1:20003",
                                              "--host", "127.0.0.1", "--port", "20006", "--policy", "cache_aware")),
        ("reference", "http://127.0.0.1:20007", (*router, "--worker-urls", "http://127.0.0.1:20004", "--host", "127.0.0.1",
                                                  "--port", "20007", "--policy", "cache_aware")),
        ("teacher", "http://127.0.0.1:20008", (*router, "--worker-urls", "http://127.0.0.1:20005", "--host", "127.0.0.1",
                                                "--port", "20008", "--policy", "cache_aware")),
    ]
    text = plan.format()
    assert "[server teacher-0] model=teacher role=regular" in text and "CUDA_VISIBLE_DEVICES=5,6,7,8 python" in text


def test_gpus_map_through_the_parents_cuda_visible_devices_and_a_running_router_gets_registrations(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    plan, _ = plan_for(tmp_path, "groups: [{name: actor, num_engines: 2, gpus_per_engine: 2}]",
                       sglang_router_ip="10.0.0.9", sglang_router_port=30000)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers] == ["4,5", "6,7"]
    assert [(r.url, r.argv, r.register) for r in plan.routers] == [("http://10.0.0.9:30000", None, True)]


@pytest.mark.parametrize("yaml_text, message", [
    ("groups: [{name: a, num_engines: two}]", "Expected `int`, got `str` - at `$.groups[0].num_engines`"),
    ("groups: [{name: a, gpus: 2}]", "unknown field `gpus` - at `$.groups[0]`"),
    ("groups: [{name: a, role: encoder}]", "$.groups[0].role"),
    ("groups: [{name: a}, {name: a, model: reference}]", "$.groups[1].name"),
    ("groups: [{name: a, args: {tp-size: 2}}]", "$.groups[0].args.tp-size: slime sets --tp-size itself"),
    ("groups: [{name: a}, {name: t, model: teacher}]", "$.groups[1].model_path: required for model 'teacher'"),
    ("groups: [{name: r, model: reference}]", "no group serves model 'actor'"),
    ("groups: [{name: a}, {name: p, role: prefill}, {name: d, role: decode}]", "PD disaggregation needs prefill and decode"),
    ("groups: [{name: p, role: prefill}]", "PD disaggregation needs prefill and decode"),
    ("groups: [{name: a, num_engines: 0}]", "num_engines=0"),
    ("groups: [{name: a\n", "not valid YAML"),
])
def test_a_bad_yaml_is_an_error_naming_the_file_and_the_path(tmp_path, yaml_text, message):
    with pytest.raises(ConfigError) as info:
        plan_for(tmp_path, yaml_text)
    assert "sglang.yaml" in str(info.value) and message in str(info.value)


def test_a_gpu_count_that_disagrees_with_rollout_num_gpus_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"needs 4 GPUs .* --rollout-num-gpus=8"):
        plan_for(tmp_path, "groups: [{name: a, num_engines: 2, gpus_per_engine: 2}]", rollout_num_gpus=8)
    with pytest.raises(ConfigError, match="multiple of --rollout-num-gpus-per-engine=2"):
        build_launch_plan(EngineConfig(rollout_num_gpus=3, rollout_num_gpus_per_engine=2))


def test_group_args_override_replace_and_drop_global_flags():
    group = ServerGroup(name="g", args={"mem-fraction-static": 0.8, "enable-memory-saver": False, "cuda_graph_bs": [1, 2], "trust-remote-code": True})
    tokens = ("--mem-fraction-static", "0.7", "--enable-memory-saver", "--cuda-graph-bs", "8", "--log-level=info")
    assert group_args(tokens, group) == ["--log-level=info", "--mem-fraction-static", "0.8", "--cuda_graph_bs", "1", "2", "--trust-remote-code"]


def test_embedded_and_external_plans(tmp_path):
    embedded = build_launch_plan(EngineConfig(hf_checkpoint="/m", num_engines=2, engine_threads=3), seed=7)
    assert [s.env for s in embedded.servers] == [{"OMP_NUM_THREADS": "3"}] * 2
    assert [s.argv[s.argv.index("--seed") + 1] for s in embedded.servers] == ["7", "8"] and embedded.routers == ()
    external = build_launch_plan(EngineConfig(rollout_external_engine_addrs=("10.0.0.1:30000",), sglang_router_ip="10.0.0.2", sglang_router_port=1))
    assert external.external_urls == ("http://10.0.0.1:30000",) and external.routers[0].register is False
    with pytest.raises(ConfigError, match="cannot be combined"):
        build_launch_plan(EngineConfig(rollout_external_engine_addrs=("h:1",), rollout_num_gpus=2))


def test_opd_teacher_is_an_embedded_engine_or_running_urls_and_refused_for_sglang_servers(tmp_path):
    plan = build_launch_plan(EngineConfig(hf_checkpoint="/ckpt/student", opd_teacher_load="/ckpt/teacher"), python=PY)
    assert plan.backend == "embedded" and plan.models() == ["actor", "teacher"]
    (teacher,) = [s for s in plan.servers if s.model == "teacher"]
    assert teacher.argv[teacher.argv.index("--model") + 1] == "/ckpt/teacher" and teacher.argv[teacher.argv.index("--weight-version") + 1] == "0"
    plan = build_launch_plan(EngineConfig(hf_checkpoint="/ckpt/student", rollout_external_engine_addrs=("h:1",), opd_teacher_addrs=("h:2",)))
    assert plan.teacher_urls == ("http://h:2",) and plan.models() == ["actor", "teacher"] and "[external teacher] http://h:2" in plan.format()
    with pytest.raises(ConfigError, match="--opd-teacher-load.*--sglang-config"):
        build_launch_plan(EngineConfig(hf_checkpoint="/p", rollout_num_gpus=1, opd_teacher_load="/ckpt/teacher"), python=PY,
                          is_free=lambda host, port: True)
    yaml_plan, _ = plan_for(tmp_path, YAML, rollout_num_gpus=9)
    assert "teacher" in yaml_plan.models()  # the SGLang way: a model: teacher group
