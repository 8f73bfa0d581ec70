"""Shared helpers for the embedded-engine tests: reference logprobs and runner-level requests."""

from __future__ import annotations

import threading
import time

import torch

from slime.servers.embedded.request import EngineRequest
from slime.servers.embedded.sampling import SamplingParams, seeded_generator, token_logprobs


def reference_logprobs(model, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """Logprobs of ``output`` from one plain full forward of the HF model over prompt + output."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0]  # [P + N, V]
    return token_logprobs(logits[len(prompt) - 1 : -1], torch.tensor(output), temperature).tolist()


def max_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def make_request(rid: str, prompt: list[int], *, seed: int = 0, return_logprob: bool = True, **params) -> EngineRequest:
    params.setdefault("ignore_eos", True)
    return EngineRequest(
        rid=rid,
        prompt_ids=list(prompt),
        params=SamplingParams(**params),
        generator=seeded_generator(seed, rid),
        return_logprob=return_logprob,
    )


class StepGate:
    """A runner ``step_hook`` that holds the runner thread once ``when(runner)`` first holds, until a
    control op is posted (or ``release()``), so a test can land an abort / pause / join at a known step."""

    def __init__(self, when):
        self.when = when
        self.reached = threading.Event()
        self._release = threading.Event()

    def release(self) -> None:
        self._release.set()

    def __call__(self, runner) -> None:
        if self.reached.is_set() or not self.when(runner):
            return
        self.reached.set()
        deadline = time.monotonic() + 10.0
        while runner.num_pending_ops == 0 and not self._release.is_set() and time.monotonic() < deadline:
            time.sleep(0.001)
