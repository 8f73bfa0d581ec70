"""The standard long-tail workload of ``slime bench rollout`` (issue 3) and each mode's knobs.

Workload (the same for every mode; flags override the starred ones, nothing else changes it):

- response lengths log-normal, median* 1,000 and p99* 10,000 tokens, cap* 16,000 (also
  ``rollout_max_response_len``), no early stop; drawn by the client and enforced per request
  (``lengths.py``: ``max_new_tokens`` from the draw, ``ignore_eos``), so a simulated and a real
  engine generate the same lengths; 32* groups x 8* samples per step; 10 steps*;
- engine: 256* running requests, decode step 8* ms + 0.05* ms x running, prefill 0.02* ms per token,
  time scale* 3 (all simulated times run 3x faster on the wall clock; a real engine runs at 1);
- trainer: 45 s* of simulated time per step (15 s wall at scale 3); weight update 1 s simulated.

Mode knobs (ours to pick; see ``docs/benchmarks.md`` for the reasoning):

- ``sync``: one batch of 32 groups at a time, nothing aborted.
- ``april``: 64 groups in flight (2x over-provisioning), abort at target, recycle partials;
  generation goes on during the train step, partials first (``overlap_train=True``;
  ``--no-april-overlap-train`` gives classic APRIL, where the engine idles while training);
  ``max_staleness`` 4 (partials resume oldest first, so their lag stays small).
- ``async``: ``ASYNC_CAPACITY`` (48) groups in flight, ``ASYNC_MAX_STALENESS`` (4),
  staleness policy ``mask``; weights are updated in place (pause, load, continue).

Example: at 256 running one decode step is 8 + 0.05 x 256 = 20.8 simulated ms = 6.9 wall ms, so a
full engine makes 256 / 6.9 ms = 37k tokens/s wall; a batch (256 samples x ~1,630 tokens mean =
~415k tokens) then takes ~11 s wall, less than the 15 s train step.
"""

from __future__ import annotations

import random
from typing import Any, Literal

import msgspec

from slime.config import LoopConfig, RolloutConfig
from slime.data.dataset import PromptRow

__all__ = ["Workload", "MODES", "ASYNC_CAPACITY", "ASYNC_MAX_STALENESS", "Mode"]

Mode = Literal["sync", "april", "async"]
MODES: tuple[Mode, ...] = ("sync", "april", "async")
ASYNC_CAPACITY = 48
"""Groups in flight in async mode (ready groups waiting for the trainer not counted) = 384 requests
for 256 slots. Measured on the standard workload (2026-11-30, 10 steps, eta 4; trained tokens/s,
slot utilization, share of generated tokens masked as too stale): 32 -> 17.7k, 0.34, 0 % (the
trainer waits for data); **48 -> 20.9k, 0.51, 2.9 %**; 64 -> 19.8k, 0.67, 8.8 %; 128 -> 17.8k,
0.74, 17 %. Past 48 the engine only generates what the trainer cannot take in time: the trainer,
not the engine, is the bottleneck here (see the module doc)."""
ASYNC_MAX_STALENESS = 4
"""Version lag bound of async mode (AReaL's eta). Nearly every async token is trained >= 1 version
after it was sampled (it was generated while the previous batch trained), and a group waits for
its longest sample: a 10k-token sample needs ~4 train steps at full load. Measured on this workload
(scale 10, capacity 64; delivered tokens/s, share of delivered tokens masked as too stale):
eta 1 -> 49k, 13 % (admission holds new groups until the weight update: (v + 2) x 32 groups may
start by version v, and the trainer has just taken 32 of them); eta 2 -> 71k, 20 %; eta 3 -> 71k,
7 %; eta 4 -> 71k, 3 %. eta 4 keeps 97 % of the delivered tokens trainable."""
NUM_PROMPTS = 4096


class Workload(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    steps: int = 10
    time_scale: float = 3.0
    train_s: float = 45.0
    """Simulated seconds of one train step; slept as train_s / time_scale wall seconds."""
    median: float = 1000.0
    p99: float = 10000.0
    max_len: int = 16000
    seed: int = 1234
    rollout_batch_size: int = 32
    n_samples_per_prompt: int = 8
    max_running_requests: int = 256
    decode_step_ms: float = 8.0
    decode_step_per_req_ms: float = 0.05
    prefill_ms_per_token: float = 0.02
    weight_sync_ms: float = 1000.0
    april_over_sampling: int = 64
    april_overlap_train: bool = True
    """APRIL keeps generating (partials first) during the train step after aborting at the target."""
    async_capacity: int = ASYNC_CAPACITY
    async_max_staleness: int = ASYNC_MAX_STALENESS

    def __post_init__(self) -> None:
        if self.steps < 1 or self.time_scale <= 0 or self.train_s < 0:
            raise ValueError(
                f"--steps={self.steps} must be >= 1, --time-scale={self.time_scale} > 0, --train-s={self.train_s} >= 0"
            )
        if not 1 <= self.median <= self.p99 or self.max_len < 1:
            raise ValueError(f"need 1 <= --median={self.median} <= --p99={self.p99} and --max-len={self.max_len} >= 1")
        if self.rollout_batch_size < 1 or self.n_samples_per_prompt < 1 or self.max_running_requests < 1:
            raise ValueError(
                f"--rollout-batch-size={self.rollout_batch_size}, --n-samples-per-prompt={self.n_samples_per_prompt} "
                f"and --max-running-requests={self.max_running_requests} must be >= 1"
            )
        for name in ("april_over_sampling", "async_capacity"):
            if getattr(self, name) < self.rollout_batch_size:
                raise ValueError(
                    f"{name}={getattr(self, name)} must be >= rollout_batch_size={self.rollout_batch_size}"
                )

    def sim_flags(self) -> list[str]:
        """``slime engine --sim`` flags of the simulated engine (initial weight version "0").

        Every trajectory is ``max_len`` long, so the engine stops where the client's
        ``max_new_tokens`` says, as a real engine does with ``ignore_eos`` (``lengths.py``).
        """
        values = {
            "--max-running-requests": self.max_running_requests,
            "--decode-step-ms": self.decode_step_ms,
            "--decode-step-per-req-ms": self.decode_step_per_req_ms,
            "--prefill-ms-per-token": self.prefill_ms_per_token,
            "--time-scale": self.time_scale,
            "--weight-sync-ms": self.weight_sync_ms,
            "--response-len-median": self.max_len,
            "--response-len-p99": self.max_len,
            "--max-response-len": self.max_len,
            "--seed": self.seed,
            "--weight-version": "0",
        }
        return [str(x) for kv in values.items() for x in kv]

    def rollout_config(self) -> RolloutConfig:
        # Requests in async mode may live for many train steps; nothing here should time out.
        return RolloutConfig(
            n_samples_per_prompt=self.n_samples_per_prompt,
            rollout_max_response_len=self.max_len,
            request_timeout_s=3600.0,
            control_timeout_s=600.0,
            reward_timeout_s=60.0,
        )

    def loop_config(self, mode: Mode) -> LoopConfig:
        common: dict[str, Any] = dict(
            mode=mode, rollout_batch_size=self.rollout_batch_size, num_rollout=self.steps, abort_timeout_s=120.0
        )
        if mode == "sync":
            return LoopConfig(**common, over_sampling_batch_size=self.rollout_batch_size)
        if mode == "april":
            return LoopConfig(
                **common,
                over_sampling_batch_size=self.april_over_sampling,
                overlap_train=self.april_overlap_train,
                max_staleness=4,
            )
        return LoopConfig(
            **common,
            over_sampling_batch_size=self.async_capacity,
            max_staleness=self.async_max_staleness,
            staleness_policy="mask",
        )

    def prompts(self) -> tuple[list[PromptRow], dict[str, list[int]]]:
        """Synthetic rows ``p0, p1, ...`` and the fixed map text -> 16..64 random token ids (seeded)."""
        rng = random.Random(self.seed)
        rows = [PromptRow(index=i, prompt=f"p{i}") for i in range(NUM_PROMPTS)]
        ids = {row.prompt: [rng.randrange(3, 32000) for _ in range(rng.randint(16, 64))] for row in rows}
        return rows, ids
