"""``SimConfig``: every knob of the simulated engine, one field per ``slime engine --sim`` flag.

Flags: ``FLAGS`` maps each ``slime engine --sim`` flag onto its field (``add_sim_flags`` /
``config_from_args``). Units: ``*_ms`` fields are milliseconds of *simulated* time; ``time_scale``
S turns them into wall time (wall = simulated / S). Lengths are response tokens.

Example (the long-tail benchmark): ``SimConfig(time_scale=3, response_len_median=1000,
response_len_p99=10000)`` with 256 requests running takes 8 + 0.05 * 256 = 20.8 simulated ms per
decode step, 6.9 wall ms; a 10000-token response then holds its slot for ~69 wall seconds.
"""

from __future__ import annotations

import argparse

import msgspec

from slime.errors import ConfigError

__all__ = ["SimConfig", "FLAGS", "add_sim_flags", "config_from_args"]


class SimConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    max_running_requests: int = 256
    """Requests decoded together; the rest wait FIFO (``--max-running-requests``)."""
    decode_step_ms: float = 8.0
    """Fixed cost ``a`` of one decode step, simulated ms (``--decode-step-ms``)."""
    decode_step_per_req_ms: float = 0.05
    """Cost ``b`` per running request per step, simulated ms: step = a + b * running
    (``--decode-step-per-req-ms``)."""
    prefill_ms_per_token: float = 0.02
    """Cost ``c`` per prefilled token (prompt plus re-sent partial response), simulated ms, added to
    the step in which the request is admitted (``--prefill-ms-per-token``)."""
    time_scale: float = 1.0
    """Divides all simulated time: wall seconds = simulated seconds / time_scale (``--time-scale``)."""
    weight_sync_ms: float = 1000.0
    """Simulated ms one ``/update_weights_from_disk`` takes once it runs (``--weight-sync-ms``)."""
    response_len_median: float = 1000.0
    """Median of the log-normal response-length distribution, tokens (``--response-len-median``)."""
    response_len_p99: float = 10000.0
    """99th percentile of the log-normal response length, tokens (``--response-len-p99``)."""
    response_len_file: str | None = None
    """JSON histogram of response lengths, replacing the log-normal (``--response-len-file``): a list
    of lengths, or ``{"bins": [...], "counts": [...]}`` (see ``lengths.py``)."""
    max_response_len: int = 16000
    """Cap on a trajectory's total response length, tokens (``--max-response-len``)."""
    vocab_size: int = 32000
    """Output token ids are drawn from [3, vocab_size) (``--vocab-size``)."""
    eos_token_id: int = 2
    """The last token of every trajectory that reaches its drawn length (``--eos-token-id``)."""
    seed: int = 0
    """Engine seed, mixed into every length, token and logprob draw (``--seed``)."""
    weight_version: str = "default"
    """Initial ``weight_version`` (``--weight-version``)."""
    model_path: str = "slime-sim"
    """Reported by ``/model_info``; replaced by the path of each weight update (``--model-path``)."""
    instant: bool = False
    """Finish every request at once with all its tokens, no simulated time (``--instant``)."""
    max_tracked_trajectories: int = 100_000
    """Trajectory ids (seeds, rid stems) whose prompts are remembered for resume; the least recently
    used are forgotten beyond this (~700 bytes each)."""

    def __post_init__(self) -> None:
        checks = [
            (self.max_running_requests >= 1, "--max-running-requests", self.max_running_requests, ">= 1"),
            (self.decode_step_ms >= 0, "--decode-step-ms", self.decode_step_ms, ">= 0"),
            (self.decode_step_per_req_ms >= 0, "--decode-step-per-req-ms", self.decode_step_per_req_ms, ">= 0"),
            (self.prefill_ms_per_token >= 0, "--prefill-ms-per-token", self.prefill_ms_per_token, ">= 0"),
            (
                self.decode_step_ms + self.decode_step_per_req_ms > 0 or self.instant,
                "--decode-step-ms",
                self.decode_step_ms,
                "> 0 together with --decode-step-per-req-ms (or --instant)",
            ),
            (self.time_scale > 0, "--time-scale", self.time_scale, "> 0"),
            (self.weight_sync_ms >= 0, "--weight-sync-ms", self.weight_sync_ms, ">= 0"),
            (self.response_len_median >= 1, "--response-len-median", self.response_len_median, ">= 1"),
            (
                self.response_len_p99 >= self.response_len_median,
                "--response-len-p99",
                self.response_len_p99,
                f">= --response-len-median ({self.response_len_median})",
            ),
            (self.max_response_len >= 1, "--max-response-len", self.max_response_len, ">= 1"),
            (self.vocab_size > 4, "--vocab-size", self.vocab_size, "> 4"),
            (
                0 <= self.eos_token_id < self.vocab_size,
                "--eos-token-id",
                self.eos_token_id,
                f"in [0, --vocab-size={self.vocab_size})",
            ),
            (self.max_tracked_trajectories >= 1, "max_tracked_trajectories", self.max_tracked_trajectories, ">= 1"),
        ]
        for ok, flag, value, expected in checks:
            if not ok:
                raise ConfigError(f"{flag}: expected {expected}, got {value!r}")

    def step_ms(self, num_running: int, num_prefill_tokens: int = 0) -> float:
        """Simulated ms of one step: ``a + b * num_running + c * num_prefill_tokens``.

        Example: defaults, 256 running, one admitted request of 500 tokens -> 8 + 12.8 + 10 = 30.8 ms.
        """
        return (
            self.decode_step_ms
            + self.decode_step_per_req_ms * num_running
            + self.prefill_ms_per_token * num_prefill_tokens
        )


FLAGS: dict[str, str] = {
    "--max-running-requests": "max_running_requests",
    "--decode-step-ms": "decode_step_ms",
    "--decode-step-per-req-ms": "decode_step_per_req_ms",
    "--prefill-ms-per-token": "prefill_ms_per_token",
    "--time-scale": "time_scale",
    "--weight-sync-ms": "weight_sync_ms",
    "--response-len-median": "response_len_median",
    "--response-len-p99": "response_len_p99",
    "--response-len-file": "response_len_file",
    "--max-response-len": "max_response_len",
    "--vocab-size": "vocab_size",
    "--eos-token-id": "eos_token_id",
    "--seed": "seed",
    "--weight-version": "weight_version",
    "--model-path": "model_path",
    "--instant": "instant",
}
"""Every ``slime engine --sim`` flag and the ``SimConfig`` field it sets (defaults come from the struct)."""


def add_sim_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one flag per ``FLAGS`` entry (type and default from ``SimConfig``; field docs above)."""
    defaults = SimConfig()
    for flag, name in FLAGS.items():
        default = getattr(defaults, name)
        if isinstance(default, bool):
            parser.add_argument(flag, dest=name, action="store_true", help=f"(SimConfig.{name})")
            continue
        kind = {int: int, float: float}.get(type(default), str)
        parser.add_argument(flag, dest=name, type=kind, default=default, help=f"default {default!r} (SimConfig.{name})")
    return parser


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """Build the config from parsed flags. Raises ConfigError naming the bad flag."""
    return SimConfig(**{name: getattr(ns, name) for name in FLAGS.values()})
