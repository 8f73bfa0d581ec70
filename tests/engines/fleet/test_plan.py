"""The launch plan from ``--sglang-config`` server groups, from flags, and the YAML's errors.

Ports come from a fake ``is_free`` (every port free), so they are numbered from ``base_port`` in
plan order: servers group by group, a prefill server's bootstrap port right after its own, then
one router per model.
"""

from __future__ import annotations

import textwrap

import pytest

from slime.config import EngineConfig
from slime.engines.fleet.groups import ServerGroup, group_args
from slime.engines.fleet.plan import build_launch_plan
from slime.errors import ConfigError

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
    config = EngineConfig(
        hf_checkpoint="/ckpt/policy",
        sglang_config=str(path),
        base_port=20000,
        sglang_args=("--mem-fraction-static", "0.7", "--enable-memory-saver"),
        **engine,
    )
    return build_launch_plan(config, weight_version="3", python=PY, is_free=lambda host, port: True), path


def server(name, gpus, port, model_path, tp, version, *tail):
    head = [
        PY,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp-size",
        str(tp),
        "--weight-version",
        version,
    ]
    return name, {"CUDA_VISIBLE_DEVICES": gpus}, (*head, *tail)


def test_groups_give_pd_servers_heterogeneous_args_several_models_and_one_router_each(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan, _ = plan_for(tmp_path, YAML, rollout_num_gpus=9, router_args=("--policy", "cache_aware"))
    assert [(s.name, s.env, s.argv) for s in plan.servers] == [
        server(
            "prefill-0",
            "0,1",
            20000,
            "/ckpt/policy",
            2,
            "3",
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            "20001",
            "--enable-memory-saver",
            "--mem-fraction-static",
            "0.8",
        ),
        server(
            "decode-0",
            "2",
            20002,
            "/ckpt/policy",
            1,
            "3",
            "--disaggregation-mode",
            "decode",
            "--mem-fraction-static",
            "0.7",
            "--cuda-graph-max-bs",
            "256",
        ),
        server(
            "decode-1",
            "3",
            20003,
            "/ckpt/policy",
            1,
            "3",
            "--disaggregation-mode",
            "decode",
            "--mem-fraction-static",
            "0.7",
            "--cuda-graph-max-bs",
            "256",
        ),
        server("ref-0", "4", 20004, "/ckpt/policy", 1, "0", "--enable-memory-saver", "--mem-fraction-static", "0.3"),
        server(
            "teacher-0",
            "5,6,7,8",
            20005,
            "/ckpt/teacher-32b",
            4,
            "0",
            "--mem-fraction-static",
            "0.7",
            "--enable-memory-saver",
            "--quantization",
            "fp8",
        ),
    ]
    router = [PY, "-m", "sglang_router.launch_router"]
    assert [(r.model, r.url, r.argv) for r in plan.routers] == [
        (
            "actor",
            "http://127.0.0.1:20006",
            (
                *router,
                "--pd-disaggregation",
                "--prefill",
                "http://127.0.0.1:20000",
                "20001",
                "--decode",
                "http://127.0.0.1:20002",
                "--decode",
                "http://127.0.0.1:20003",
                "--host",
                "127.0.0.1",
                "--port",
                "20006",
                "--policy",
                "cache_aware",
            ),
        ),
        (
            "reference",
            "http://127.0.0.1:20007",
            (
                *router,
                "--worker-urls",
                "http://127.0.0.1:20004",
                "--host",
                "127.0.0.1",
                "--port",
                "20007",
                "--policy",
                "cache_aware",
            ),
        ),
        (
            "teacher",
            "http://127.0.0.1:20008",
            (
                *router,
                "--worker-urls",
                "http://127.0.0.1:20005",
                "--host",
                "127.0.0.1",
                "--port",
                "20008",
                "--policy",
                "cache_aware",
            ),
        ),
    ]
    text = plan.format()
    assert "[server teacher-0] model=teacher role=regular" in text and "CUDA_VISIBLE_DEVICES=5,6,7,8 python" in text


def test_gpus_map_through_the_parents_cuda_visible_devices_and_a_running_router_gets_registrations(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    plan, _ = plan_for(
        tmp_path,
        "groups: [{name: actor, num_engines: 2, gpus_per_engine: 2}]",
        sglang_router_ip="10.0.0.9",
        sglang_router_port=30000,
    )
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers] == ["4,5", "6,7"]
    assert [(r.url, r.argv, r.register) for r in plan.routers] == [("http://10.0.0.9:30000", None, True)]


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("groups: [{name: a, num_engines: two}]", "Expected `int`, got `str` - at `$.groups[0].num_engines`"),
        ("groups: [{name: a, gpus: 2}]", "unknown field `gpus` - at `$.groups[0]`"),
        ("groups: [{name: a, role: encoder}]", "$.groups[0].role"),
        ("groups: [{name: a}, {name: a, model: reference}]", "$.groups[1].name"),
        ("groups: [{name: a, args: {tp-size: 2}}]", "$.groups[0].args.tp-size: slime sets --tp-size itself"),
        ("groups: [{name: a}, {name: t, model: teacher}]", "$.groups[1].model_path: required for model 'teacher'"),
        ("groups: [{name: r, model: reference}]", "no group serves model 'actor'"),
        (
            "groups: [{name: a}, {name: p, role: prefill}, {name: d, role: decode}]",
            "PD disaggregation needs prefill and decode",
        ),
        ("groups: [{name: p, role: prefill}]", "PD disaggregation needs prefill and decode"),
        ("groups: [{name: a, num_engines: 0}]", "num_engines=0"),
        ("groups: [{name: a\n", "not valid YAML"),
    ],
)
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
    group = ServerGroup(
        name="g",
        args={
            "mem-fraction-static": 0.8,
            "enable-memory-saver": False,
            "cuda_graph_bs": [1, 2],
            "trust-remote-code": True,
        },
    )
    tokens = ("--mem-fraction-static", "0.7", "--enable-memory-saver", "--cuda-graph-bs", "8", "--log-level=info")
    assert group_args(tokens, group) == [
        "--log-level=info",
        "--mem-fraction-static",
        "0.8",
        "--cuda_graph_bs",
        "1",
        "2",
        "--trust-remote-code",
    ]


def test_embedded_and_external_plans(tmp_path):
    embedded = build_launch_plan(EngineConfig(hf_checkpoint="/m", num_engines=2, engine_threads=3), seed=7)
    assert [s.env for s in embedded.servers] == [{"OMP_NUM_THREADS": "3"}] * 2
    assert [s.argv[s.argv.index("--seed") + 1] for s in embedded.servers] == ["7", "8"] and embedded.routers == ()
    external = build_launch_plan(
        EngineConfig(
            rollout_external_engine_addrs=("10.0.0.1:30000",), sglang_router_ip="10.0.0.2", sglang_router_port=1
        )
    )
    assert external.external_urls == ("http://10.0.0.1:30000",) and external.routers[0].register is False
    with pytest.raises(ConfigError, match="cannot be combined"):
        build_launch_plan(EngineConfig(rollout_external_engine_addrs=("h:1",), rollout_num_gpus=2))


def test_opd_teacher_is_an_embedded_engine_or_running_urls_and_refused_for_sglang_servers(tmp_path):
    plan = build_launch_plan(EngineConfig(hf_checkpoint="/ckpt/student", opd_teacher_load="/ckpt/teacher"), python=PY)
    assert plan.backend == "embedded" and plan.models() == ["actor", "teacher"]
    (teacher,) = [s for s in plan.servers if s.model == "teacher"]
    assert (
        teacher.argv[teacher.argv.index("--model") + 1] == "/ckpt/teacher"
        and teacher.argv[teacher.argv.index("--weight-version") + 1] == "0"
    )
    plan = build_launch_plan(
        EngineConfig(hf_checkpoint="/ckpt/student", rollout_external_engine_addrs=("h:1",), opd_teacher_addrs=("h:2",))
    )
    assert (
        plan.teacher_urls == ("http://h:2",)
        and plan.models() == ["actor", "teacher"]
        and "[external teacher] http://h:2" in plan.format()
    )
    with pytest.raises(ConfigError, match="--opd-teacher-load.*--sglang-config"):
        build_launch_plan(
            EngineConfig(hf_checkpoint="/p", rollout_num_gpus=1, opd_teacher_load="/ckpt/teacher"),
            python=PY,
            is_free=lambda host, port: True,
        )
    yaml_plan, _ = plan_for(tmp_path, YAML, rollout_num_gpus=9)
    assert "teacher" in yaml_plan.models()  # the SGLang way: a model: teacher group


def _flag(server, name):
    return server.argv[server.argv.index(name) + 1] if name in server.argv else None


def test_one_regular_server_gets_no_router_several_do_and_router_flags_ask_for_one():
    one = build_launch_plan(EngineConfig(hf_checkpoint="/m", rollout_num_gpus=1), python=PY, is_free=lambda h, p: True)
    assert one.routers == () and "model 'actor': one server, no router" in one.format()
    two = build_launch_plan(EngineConfig(hf_checkpoint="/m", rollout_num_gpus=2), python=PY, is_free=lambda h, p: True)
    assert [r.argv[r.argv.index("--worker-urls") + 1 : r.argv.index("--host")] for r in two.routers] == [
        tuple(s.url for s in two.servers)
    ]
    asked = build_launch_plan(
        EngineConfig(hf_checkpoint="/m", rollout_num_gpus=1, router_args=("--policy", "manual")),
        python=PY,
        is_free=lambda h, p: True,
    )
    assert len(asked.routers) == 1 and asked.routers[0].argv[-2:] == ("--policy", "manual")


@pytest.mark.parametrize(
    "visible, trainer, rollout, expect_gpus, shared",
    [
        ("0", 1, 1, ["0"], True),  # one H200: the server shares the trainer's GPU
        ("0,1,2,3", 2, 2, ["2", "3"], False),  # enough GPUs: after the trainer's (THUDM/slime's placement)
        ("4,5,6", 2, 2, ["4", "5"], True),  # too few for both: from the first, sharing
        ("0,1", 0, 2, ["0", "1"], False),  # a CPU trainer shares nothing
    ],
)
def test_servers_take_the_gpus_after_the_trainers_or_share_them_with_a_memory_fraction_left_for_it(
    monkeypatch, visible, trainer, rollout, expect_gpus, shared
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    plan = build_launch_plan(
        EngineConfig(hf_checkpoint="/m", rollout_num_gpus=rollout),
        python=PY,
        is_free=lambda h, p: True,
        trainer_gpus=trainer,
    )
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers] == expect_gpus
    fractions = [_flag(s, "--mem-fraction-static") for s in plan.servers]
    if shared:
        assert fractions[0] == "0.5" and "shares GPU(s) with the trainer" in plan.format()
    else:
        assert fractions == [None] * rollout and not any("shares" in note for note in plan.notes)
    assert not any("--enable-memory-saver" in s.argv for s in plan.servers)  # only with --colocate


def test_with_colocate_servers_share_from_gpu_0_with_memory_saver_unless_the_user_chose(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    plan = build_launch_plan(
        EngineConfig(hf_checkpoint="/m", rollout_num_gpus=2),
        python=PY,
        is_free=lambda h, p: True,
        trainer_gpus=2,
        colocate=True,
    )
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.servers] == ["0", "1"]
    assert all(s.argv[-3:] == ("--mem-fraction-static", "0.5", "--enable-memory-saver") for s in plan.servers)
    mine = build_launch_plan(
        EngineConfig(hf_checkpoint="/m", rollout_num_gpus=1, sglang_args=("--mem-fraction-static=0.7",)),
        python=PY,
        is_free=lambda h, p: True,
        trainer_gpus=1,
        colocate=True,
    )
    assert mine.servers[0].argv[-2:] == ("--enable-memory-saver", "--mem-fraction-static=0.7")
    (tmp_path / "groups.yaml").write_text(
        "groups: [{name: a, args: {enable-memory-saver: false, mem_fraction_static: 0.4}}]"
    )
    plan = build_launch_plan(
        EngineConfig(hf_checkpoint="/m", sglang_config=str(tmp_path / "groups.yaml")),
        python=PY,
        is_free=lambda h, p: True,
        colocate=True,
    )
    assert (
        "--enable-memory-saver" not in plan.servers[0].argv and _flag(plan.servers[0], "--mem_fraction_static") == "0.4"
    )


def test_the_trainers_gpu_count_comes_from_torch_when_cuda_visible_devices_is_unset(monkeypatch):
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    plan = build_launch_plan(
        EngineConfig(hf_checkpoint="/m", rollout_num_gpus=1), python=PY, is_free=lambda h, p: True, trainer_gpus=1
    )
    assert (
        plan.servers[0].env == {"CUDA_VISIBLE_DEVICES": "0"}
        and _flag(plan.servers[0], "--mem-fraction-static") == "0.5"
    )
    with pytest.raises(ConfigError, match="need 2 GPUs but CUDA_VISIBLE_DEVICES lists 1"):
        build_launch_plan(
            EngineConfig(hf_checkpoint="/m", rollout_num_gpus=2), python=PY, is_free=lambda h, p: True, trainer_gpus=1
        )


def test_async_mode_launches_actor_servers_without_a_radix_cache_unless_the_user_chose(monkeypatch):
    """In-place updates keep the prefix cache (no flush while paused in place): without a radix cache no
    request reuses KV of older weights, so async updates stay in place (slime.loop.step.pause_mode)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    kw = dict(python=PY, is_free=lambda h, p: True)
    plan = build_launch_plan(EngineConfig(hf_checkpoint="/m", rollout_num_gpus=1), in_place_updates=True, **kw)
    assert plan.servers[0].argv.count("--disable-radix-cache") == 1
    assert any("--disable-radix-cache" in n for n in plan.notes)
    assert (
        "--disable-radix-cache"
        not in build_launch_plan(EngineConfig(hf_checkpoint="/m", rollout_num_gpus=1), **kw).servers[0].argv
    )
    mine = build_launch_plan(
        EngineConfig(hf_checkpoint="/m", rollout_num_gpus=1, sglang_args=("--disable-radix-cache",)),
        in_place_updates=True,
        **kw,
    )
    assert mine.servers[0].argv.count("--disable-radix-cache") == 1


def test_a_group_that_keeps_its_radix_cache_in_async_mode_is_noted_in_the_plan(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "groups.yaml").write_text("groups: [{name: a, args: {disable-radix-cache: false}}]")
    plan = build_launch_plan(
        EngineConfig(hf_checkpoint="/m", sglang_config=str(tmp_path / "groups.yaml")),
        python=PY,
        is_free=lambda h, p: True,
        in_place_updates=True,
    )
    assert "--disable-radix-cache" not in plan.servers[0].argv
    assert any("keeps its radix cache" in n for n in plan.notes)


def test_updates_in_place_is_async_mode_without_colocate_with_a_trainer():
    from msgspec.structs import replace

    from slime.config import Config

    def config(mode: str, colocate: bool = False) -> Config:
        c = Config()
        return replace(c, loop=replace(c.loop, mode=mode), sync=replace(c.sync, colocate=colocate))

    assert config("async").updates_in_place()
    assert not config("async", colocate=True).updates_in_place()
    assert not config("april").updates_in_place()
