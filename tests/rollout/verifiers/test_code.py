"""The code verifier runs the response's program against stdin/stdout cases and asserts in the sandbox."""

from __future__ import annotations

import json

import pytest

from slime.rollout.tools.sandbox import Sandbox
from slime.rollout.verifiers.code import CodeVerifier
from slime.types import Sample

SUM_IO = json.dumps({"inputs": ["1 2\n", "30 4\n"], "outputs": ["3\n", "34"]})


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


@pytest.fixture
def verifier():
    return CodeVerifier(Sandbox(timeout_s=1.0, memory_bytes=256 << 20))


async def test_correct_program_passes_every_stdin_case(verifier):
    s = Sample(prompt_ids=[0], label=SUM_IO, response=fenced("a, b = map(int, input().split())\nprint(a + b)"))
    assert await verifier(s) == 1.0 and s.evidence["verifier"]["verdict"] == "passed 2/2"


async def test_wrong_program_fails_and_logs_the_first_failing_case(verifier):
    s = Sample(prompt_ids=[0], label=SUM_IO, response=fenced("a, b = map(int, input().split())\nprint(a - b)"))
    assert await verifier(s) == 0.0
    assert "case 0" in s.evidence["verifier"]["logs"] and "expected '3\\n', got '-1\\n'" in s.evidence["verifier"]["logs"]


async def test_asserts_with_partial_credit_give_the_fraction_passed():
    tests = {"asserts": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]}
    s = Sample(prompt_ids=[0], metadata={"tests": tests}, response=fenced("def add(a, b):\n    return a + b"))
    assert await CodeVerifier(Sandbox(timeout_s=1.0), partial_credit=True)(s) == 0.5
    assert s.evidence["verifier"]["verdict"] == "passed 1/2" and "AssertionError" in s.evidence["verifier"]["logs"]


async def test_no_code_block_scores_zero(verifier):
    s = Sample(prompt_ids=[0], label=SUM_IO, response="print(1)")
    assert await verifier(s) == 0.0 and s.evidence["verifier"]["verdict"] == "no_code"


async def test_a_program_that_never_ends_fails_on_time():
    s = Sample(prompt_ids=[0], label=SUM_IO, response=fenced("while True:\n    pass"))
    assert await CodeVerifier(Sandbox(timeout_s=0.3))(s) == 0.0
    assert "time limit" in s.evidence["verifier"]["logs"]
