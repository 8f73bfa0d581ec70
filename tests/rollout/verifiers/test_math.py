"""The math verifier on real GSM8K rows: right, wrong and differently formatted answers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from slime.errors import PluginError
from slime.rollout.verifiers import math as math_verifier
from slime.rollout.verifiers.math import MathVerifier, extract_gold
from slime.types import Sample

GSM8K = Path(__file__).resolve().parents[3] / "data" / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def rows():
    with GSM8K.open() as f:
        return [json.loads(line) for _, line in zip(range(200), f)]


def sample_for(row, response):
    return Sample(prompt_ids=[0], prompt=row["question"], label=row["answer"], response=response)


async def test_the_reference_solution_itself_is_correct(rows):
    verifier = MathVerifier()
    for row in rows[:5]:
        s = sample_for(row, row["answer"])
        assert await verifier(s) == 1.0, row["answer"]
        assert s.evidence["verifier"]["verdict"] == "correct"


@pytest.mark.parametrize(
    "fmt", ["$%s", "%s.0", "The answer is \\boxed{%s}.", "So she makes %s dollars every day.", "#### %s"]
)
async def test_differently_formatted_right_answers_are_correct(rows, fmt):
    row = rows[0]  # Janet's ducks: 18
    assert extract_gold(row["answer"]) == "18"
    assert await MathVerifier()(sample_for(row, fmt % "18")) == 1.0


async def test_wrong_answer_and_no_answer_score_zero_with_their_verdicts(rows):
    wrong, none = sample_for(rows[0], "She makes $17 a day."), sample_for(rows[0], "I cannot tell.")
    assert await MathVerifier()(wrong) == 0.0 and wrong.evidence["verifier"]["verdict"] == "wrong"
    assert await MathVerifier()(none) == 0.0 and none.evidence["verifier"]["verdict"] == "no_answer"
    assert wrong.evidence["verifier"]["logs"] == "gold parsed as ['18', '18']; prediction parsed as ['17', '17']"


async def test_thousands_separators_match_on_either_side(rows):
    row = next(r for r in rows if len(extract_gold(r["answer"])) >= 4)
    gold = extract_gold(row["answer"])
    with_commas = f"{int(gold):,}"
    assert "," in with_commas and await MathVerifier()(sample_for(row, f"The total is {with_commas}.")) == 1.0


async def test_a_check_past_its_timeout_raises_and_says_so(rows, monkeypatch):
    monkeypatch.setattr(math_verifier, "check", lambda gold, pred: time.sleep(0.3) or (True, [], []))
    s = sample_for(rows[0], "18")
    with pytest.raises(PluginError, match="no verdict within 0.05s"):
        await MathVerifier(timeout_s=0.05)(s)
    assert s.evidence["verifier"]["verdict"] == "timeout"
