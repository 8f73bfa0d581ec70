"""SimConfig: value checks name the flag; the ``slime engine --sim`` flag list is pinned to the fields."""

from __future__ import annotations

import argparse

import msgspec
import pytest

from slime.errors import ConfigError
from slime.servers.sim import SimConfig
from slime.servers.sim.config import FLAGS, add_sim_flags, config_from_args
from slime.servers.sim.server import build_parser, main


@pytest.mark.parametrize(
    "field, value, flag",
    [
        ("time_scale", 0.0, "--time-scale"),
        ("response_len_p99", 10.0, "--response-len-p99"),
        ("max_running_requests", 0, "--max-running-requests"),
        ("eos_token_id", 40000, "--eos-token-id"),
    ],
)
def test_config_rejects_bad_values_naming_the_flag(field, value, flag):
    with pytest.raises(ConfigError, match=flag):
        SimConfig(**{field: value})


def test_every_config_field_but_the_memory_bound_has_exactly_one_flag():
    assert sorted(FLAGS.values()) == sorted(set(SimConfig.__struct_fields__) - {"max_tracked_trajectories"})
    assert set(FLAGS) == {"--" + name.replace("_", "-") for name in FLAGS.values()}


def test_flags_reach_their_fields_and_defaults_match_the_struct():
    assert config_from_args(add_sim_flags(argparse.ArgumentParser()).parse_args([])) == SimConfig()
    argv = [
        "--sim",
        "--port",
        "0",
        "--time-scale",
        "3",
        "--instant",
        "--max-response-len",
        "64",
        "--response-len-file",
        "h.json",
        "--weight-version",
        "4",
    ]
    ns = build_parser().parse_args(argv)
    config = config_from_args(ns)
    assert (ns.port, config.time_scale, config.instant, config.max_response_len) == (0, 3.0, True, 64)
    assert config.response_len_file == "h.json" and config.weight_version == "4"
    assert msgspec.structs.replace(config, instant=False).instant is False


def test_step_ms_adds_the_three_cost_terms():
    assert SimConfig().step_ms(256, 500) == pytest.approx(8 + 0.05 * 256 + 0.02 * 500)


def test_main_refuses_a_bad_flag_value_with_exit_code_2_before_serving(capsys, tmp_path):
    assert main(["--time-scale", "0"]) == 2
    assert main(["--response-len-file", str(tmp_path / "missing.json")]) == 2
    assert "--time-scale" in capsys.readouterr().err
