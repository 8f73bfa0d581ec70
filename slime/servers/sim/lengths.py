"""Response-length distributions and the 64-bit hashing every deterministic draw goes through.

A draw is a *quantile lookup*: ``length = dist.quantile(u)`` with ``u = unit_uniform(key)`` and
``key`` a 64-bit hash of the trajectory (``trajectory.py``), so one trajectory always gets the same
length, on any engine started with the same ``--seed``, with no random state to keep.

Log-normal from a median and a p99: ``mu = ln(median)``, ``sigma = (ln(p99) - ln(median)) / 2.326``
(2.326 = the standard normal's 99th percentile). Example: median 1000, p99 10000 -> mu = 6.908,
sigma = 0.990; the p90 is exp(mu + 1.2816 * sigma) = 3556 tokens.

Histogram file (``--response-len-file``), JSON, one of:

* ``[812, 90, 4410, ...]``: observed lengths; the draw is their empirical quantile.
* ``{"bins": [100, 200, 400], "counts": [5, 3, 1]}`` (as many bins as counts): those lengths with
  those weights.
* ``{"bins": [0, 100, 200, 400], "counts": [5, 3, 1]}`` (one more bin than counts): bin *edges*;
  a draw falls uniformly inside its bin (interpolated by ``u``, still deterministic).

Every length is rounded and clipped to ``[1, max_response_len]`` by the caller.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Protocol

import numpy as np

from slime.errors import ConfigError
from slime.servers.sim.config import SimConfig

__all__ = [
    "LengthDistribution",
    "LogNormalLengths",
    "EmpiricalLengths",
    "make_length_distribution",
    "mix64",
    "mix64_array",
    "unit_uniform",
    "Z_99",
]

Z_99 = 2.326
"""Standard normal 99th percentile, as the brief specifies (exactly 2.3263...)."""
MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_NORMAL = statistics.NormalDist()


def mix64(x: int) -> int:
    """SplitMix64 finaliser of a Python int (taken mod 2**64): a well-spread 64-bit hash."""
    x = (x + _GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * _M1) & MASK64
    x = ((x ^ (x >> 27)) * _M2) & MASK64
    return x ^ (x >> 31)


def mix64_array(x: np.ndarray) -> np.ndarray:
    """``mix64`` element-wise on a uint64 array (wrapping arithmetic; equal to ``mix64`` per item)."""
    x = x + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
    return x ^ (x >> np.uint64(31))


def unit_uniform(key: int) -> float:
    """A float in (0, 1) from a 64-bit key: the top 53 bits of ``mix64(key)``, centred in their cell."""
    return ((mix64(key) >> 11) + 0.5) / float(1 << 53)


class LengthDistribution(Protocol):
    def quantile(self, u: float) -> float:
        """The length (tokens, unrounded) at cumulative probability ``u`` in (0, 1)."""
        ...


class LogNormalLengths:
    """``exp(mu + sigma * z)`` with z standard normal; see the module docstring for mu and sigma."""

    def __init__(self, median: float, p99: float):
        self.mu = math.log(median)
        self.sigma = (math.log(p99) - math.log(median)) / Z_99

    def quantile(self, u: float) -> float:
        return math.exp(self.mu + self.sigma * _NORMAL.inv_cdf(u))

    def __repr__(self) -> str:
        return f"LogNormalLengths(mu={self.mu:.4f}, sigma={self.sigma:.4f})"


class EmpiricalLengths:
    """A weighted histogram; ``edges`` given: interpolate inside each bin, else return bin values.

    Args:
        values: [K] the lengths (or [K + 1] bin edges when ``edges``).
        counts: [K] non-negative weights, not all zero.
        edges: whether ``values`` are bin edges.
    """

    def __init__(self, values: list[float], counts: list[float], *, edges: bool = False):
        self.values = np.asarray(values, dtype=np.float64)
        weights = np.asarray(counts, dtype=np.float64)
        self.cdf = np.cumsum(weights) / weights.sum()
        self.edges = edges

    def quantile(self, u: float) -> float:
        i = min(int(np.searchsorted(self.cdf, u, side="right")), len(self.cdf) - 1)
        if not self.edges:
            return float(self.values[i])
        lo_mass = self.cdf[i - 1] if i else 0.0
        frac = (u - lo_mass) / max(self.cdf[i] - lo_mass, 1e-300)
        return float(self.values[i] + min(max(frac, 0.0), 1.0) * (self.values[i + 1] - self.values[i]))

    @classmethod
    def from_file(cls, path: str) -> EmpiricalLengths:
        """Read a histogram file (formats in the module docstring).

        Raises:
            ConfigError: unreadable file, wrong shape, negative or all-zero counts (names the path).
        """

        def bad(what: str) -> ConfigError:
            return ConfigError(f"--response-len-file {path}: {what}")

        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except (OSError, ValueError) as exc:
            raise bad(f"cannot read a JSON histogram ({exc})") from exc
        if isinstance(data, list):
            values, counts, edges = sorted(data), [1.0] * len(data), False
        elif isinstance(data, dict) and {"bins", "counts"} <= set(data):
            values, counts = data["bins"], data["counts"]
            if not isinstance(values, list) or not isinstance(counts, list):
                raise bad("'bins' and 'counts' must be lists")
            if len(values) not in (len(counts), len(counts) + 1):
                raise bad(
                    f"{len(values)} bins for {len(counts)} counts: expected {len(counts)} values or {len(counts) + 1} edges"
                )
            edges = len(values) == len(counts) + 1
        else:
            raise bad(f"expected a list of lengths or {{'bins', 'counts'}}, got {type(data).__name__}")
        if not counts:
            raise bad("the histogram is empty")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in [*values, *counts]):
            raise bad("bins, counts and lengths must be numbers")
        if min(counts) < 0 or sum(counts) <= 0:
            raise bad("counts must be non-negative and not all zero")
        if edges and any(b > a for a, b in zip(values[1:], values[:-1])):
            raise bad("bin edges must be non-decreasing")
        return cls(values, counts, edges=edges)


def make_length_distribution(config: SimConfig) -> LengthDistribution:
    """The histogram file when ``response_len_file`` is set, else the log-normal of median/p99."""
    if config.response_len_file:
        return EmpiricalLengths.from_file(config.response_len_file)
    return LogNormalLengths(config.response_len_median, config.response_len_p99)
