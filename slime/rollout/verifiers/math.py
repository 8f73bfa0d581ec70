"""The ``math`` verifier: is the response's final answer equal to the label? (HF ``math-verify``)

Gold: ``sample.label``; GSM8K-style labels (a worked solution ending ``#### 18``) are cut to what
follows the last ``####``, and thousands separators are dropped (``1,800`` -> ``1800``).
Prediction: what follows the last ``####`` in ``sample.response`` if there is one, else the whole
response, which ``math_verify.parse`` searches (``\\boxed{}`` first, then LaTeX and plain
expressions; the last match wins). ``math_verify.verify`` then compares numerically and
symbolically (``18`` = ``18.0`` = ``$18`` = ``\\boxed{18}``).

Reward: 1.0 correct, 0.0 wrong or no answer found. Evidence: ``sample.evidence["verifier"] =
{"checked": {"kind", "gold", "prediction"}, "verdict": "correct" | "wrong" | "no_answer" |
"timeout", "logs": "<what each side parsed as>"}``.

Timeouts: math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are turned off
and the check runs in a worker thread under ``asyncio.timeout(timeout_s)``; a timeout raises
``PluginError("... no verdict within Xs")`` (the sample is then FAILED by the reward boundary). Not covered: the worker thread
of a check that hangs inside sympy keeps running after the timeout (threads cannot be killed).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from slime.errors import PluginError
from slime.rollout import plugin_threads
from slime.types import Sample

__all__ = ["MathVerifier", "extract_gold", "extract_prediction", "check"]

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_MAX_EVIDENCE_CHARS = 1000


def extract_gold(label: str) -> str:
    """``"... #### 1,800"`` -> ``"1800"``; a label without ``####`` is used as it is (stripped)."""
    gold = label.rsplit("####", 1)[-1] if "####" in label else label
    return _THOUSANDS.sub("", gold.strip())


def extract_prediction(response: str) -> str:
    """The text after the last ``####`` when there is one, else the whole response."""
    return response.rsplit("####", 1)[-1].strip() if "####" in response else response


def check(gold: str, prediction: str) -> tuple[bool, list[str], list[str]]:
    """Parse both sides and compare. Returns ``(equal, gold_parsed, prediction_parsed)`` (as text)."""
    from math_verify import parse, verify

    gold_parsed = parse(gold, parsing_timeout=None)
    if not gold_parsed:  # a bare label such as "18" without any anchor: try it as inline math
        gold_parsed = parse(f"${gold}$", parsing_timeout=None)
    pred_parsed = parse(_THOUSANDS.sub("", prediction), parsing_timeout=None)
    equal = bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))
    return equal, [str(x) for x in gold_parsed], [str(x) for x in pred_parsed]


class MathVerifier:
    """``await MathVerifier(timeout_s=10)(sample) -> 1.0 | 0.0``; a reward function for the scheduler.

    Raises:
        PluginError: the sample has no label, or the check ran past ``timeout_s``.
    """

    needs_label = True
    """It reads ``Sample.label``: prompt rows without one are refused at load (``slime.types.RewardFn``)."""

    def __init__(self, *, timeout_s: float = 10.0):
        if timeout_s <= 0:
            raise ValueError(f"MathVerifier: timeout_s={timeout_s} must be > 0")
        self.timeout_s = timeout_s

    async def __call__(self, sample: Sample) -> float:
        if sample.label is None:
            raise PluginError(f"math verifier: sample (group {sample.group_id}, index {sample.index}) has no label")
        gold, prediction = extract_gold(sample.label), extract_prediction(sample.response)
        evidence: dict[str, Any] = {
            "checked": {"kind": "math", "gold": gold, "prediction": prediction[-_MAX_EVIDENCE_CHARS:]},
            "verdict": "timeout",
            "logs": f"math-verify did not finish within {self.timeout_s}s",
        }
        sample.evidence["verifier"] = evidence
        try:
            async with asyncio.timeout(self.timeout_s):
                equal, gold_parsed, pred_parsed = await plugin_threads.run_sync(
                    check, gold, prediction
                )  # a hung one is abandoned
        except TimeoutError:  # a PluginError: the reward boundary would report a TimeoutError as its own timeout
            raise PluginError(f"math verifier: no verdict within {self.timeout_s}s") from None
        evidence["verdict"] = "correct" if equal else ("wrong" if pred_parsed else "no_answer")
        evidence["logs"] = f"gold parsed as {gold_parsed}; prediction parsed as {pred_parsed}"
        return 1.0 if equal else 0.0
