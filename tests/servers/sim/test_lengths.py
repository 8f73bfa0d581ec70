"""Response-length distributions and the 64-bit mixing every deterministic draw goes through."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from slime.errors import ConfigError
from slime.servers.sim import SimConfig
from slime.servers.sim.lengths import (
    EmpiricalLengths,
    LogNormalLengths,
    make_length_distribution,
    mix64,
    mix64_array,
    unit_uniform,
)


def test_lognormal_median_and_p99_are_within_tolerance_on_5000_keyed_draws():
    dist = LogNormalLengths(median=1000, p99=10000)
    draws = np.array([dist.quantile(unit_uniform(k)) for k in range(5000)])
    assert abs(np.median(draws) / 1000 - 1) < 0.06
    assert abs(np.quantile(draws, 0.99) / 10000 - 1) < 0.2
    assert dist.sigma == pytest.approx((math.log(10000) - math.log(1000)) / 2.326)


def test_median_equal_to_p99_gives_that_length_for_every_draw():
    dist = LogNormalLengths(median=10, p99=10)
    assert {round(dist.quantile(unit_uniform(k))) for k in range(100)} == {10}


def test_mix64_array_matches_the_scalar_mix_and_uniforms_stay_inside_the_open_interval():
    xs = [0, 1, 2**63, 2**64 - 1, 123456789]
    assert mix64_array(np.array(xs, dtype=np.uint64)).tolist() == [mix64(x) for x in xs]
    us = [unit_uniform(k) for k in range(1000)]
    assert 0 < min(us) and max(us) < 1


@pytest.mark.parametrize(
    "payload, expected",
    [
        ([5, 1, 3, 3], {1, 3, 5}),
        ({"bins": [7, 9], "counts": [1, 0]}, {7}),
    ],
)
def test_histogram_file_values_are_drawn_by_their_weights(tmp_path, payload, expected):
    path = tmp_path / "h.json"
    path.write_text(json.dumps(payload))
    dist = make_length_distribution(SimConfig(response_len_file=str(path)))
    assert {dist.quantile(unit_uniform(k)) for k in range(500)} == expected


def test_histogram_edges_interpolate_inside_the_drawn_bin():
    dist = EmpiricalLengths([0, 100, 200], [1, 3], edges=True)
    assert dist.quantile(0.125) == pytest.approx(50)  # half-way through the first bin's mass
    assert dist.quantile(0.625) == pytest.approx(150)
    assert 100 <= dist.quantile(0.26) <= 200


@pytest.mark.parametrize("payload", ['{"bins": [1, 2, 3, 4], "counts": [1]}', '{"counts": [1]}', "[]", "not json"])
def test_bad_histogram_file_raises_config_error_naming_the_path(tmp_path, payload):
    path = tmp_path / "bad.json"
    path.write_text(payload)
    with pytest.raises(ConfigError, match="--response-len-file .*bad.json"):
        EmpiricalLengths.from_file(str(path))
