"""The code verifier runs the response's program against stdin/stdout cases and asserts in the sandbox."""

from __future__ import annotations

import json

import pytest

from slime.config import RolloutConfig
from slime.rollout.tools.sandbox import Sandbox, SandboxUnavailable, sandbox_unavailable_reason
from slime.rollout.verifiers import reward_fn_from_config
from slime.rollout.verifiers.code import CodeVerifier
from slime.types import Sample

requires_bwrap = pytest.mark.skipif(
    sandbox_unavailable_reason() is not None, reason=f"no OS sandbox: {sandbox_unavailable_reason()}"
)

SUM_IO = json.dumps({"inputs": ["1 2\n", "30 4\n"], "outputs": ["3\n", "34"]})


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


@pytest.fixture
def verifier():  # needs bwrap: only tests marked requires_bwrap use it
    return CodeVerifier(Sandbox(timeout_s=1.0, memory_bytes=256 << 20))


@requires_bwrap
async def test_correct_program_passes_every_stdin_case(verifier):
    s = Sample(prompt_ids=[0], label=SUM_IO, response=fenced("a, b = map(int, input().split())\nprint(a + b)"))
    assert await verifier(s) == 1.0 and s.evidence["verifier"]["verdict"] == "passed 2/2"


@requires_bwrap
async def test_wrong_program_fails_and_logs_the_first_failing_case(verifier):
    s = Sample(prompt_ids=[0], label=SUM_IO, response=fenced("a, b = map(int, input().split())\nprint(a - b)"))
    assert await verifier(s) == 0.0
    assert (
        "case 0" in s.evidence["verifier"]["logs"] and "expected '3\\n', got '-1\\n'" in s.evidence["verifier"]["logs"]
    )


@requires_bwrap
async def test_asserts_with_partial_credit_give_the_fraction_passed():
    tests = {"asserts": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]}
    s = Sample(prompt_ids=[0], metadata={"tests": tests}, response=fenced("def add(a, b):\n    return a + b"))
    assert await CodeVerifier(Sandbox(timeout_s=1.0), partial_credit=True)(s) == 0.5
    assert s.evidence["verifier"]["verdict"] == "passed 1/2"
    assert "add(2, 2) returned 4): assertion failed" in s.evidence["verifier"]["logs"]


@requires_bwrap
async def test_no_code_block_scores_zero(verifier):
    s = Sample(prompt_ids=[0], label=SUM_IO, response="print(1)")
    assert await verifier(s) == 0.0 and s.evidence["verifier"]["verdict"] == "no_code"


@requires_bwrap
async def test_a_program_that_never_ends_fails_on_time():
    s = Sample(prompt_ids=[0], label=SUM_IO, response=fenced("while True:\n    pass"))
    assert await CodeVerifier(Sandbox(timeout_s=0.3))(s) == 0.0
    assert "time limit" in s.evidence["verifier"]["logs"]


def test_rm_type_code_refuses_to_start_without_bwrap_unless_unsafe_is_allowed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    with pytest.raises(SandboxUnavailable, match="--allow-unsafe-code-execution"):
        reward_fn_from_config(RolloutConfig(rm_type="code"))
    verifier = reward_fn_from_config(RolloutConfig(rm_type="code", allow_unsafe_code_execution=True))
    assert verifier.sandbox.isolation == "unsafe"


@requires_bwrap
async def test_contest_scripts_that_call_exit_and_print_in_another_layout_pass(verifier):
    spec = json.dumps({"inputs": ["3\n", "0\n"], "outputs": ["1 2 3\n0.333333\n", "NO\n"]})
    code = (
        "n = int(input())\nif n == 0:\n    print('NO')\n    exit()\nprint(*range(1, n + 1), sep='\\n')\nprint(1 / 3)\n"
    )
    s = Sample(prompt_ids=[0], label=spec, response=fenced(code))
    assert await verifier(s) == 1.0, s.evidence  # tokens compared in order, numbers within FLOAT_TOLERANCE


@requires_bwrap
async def test_asserts_accept_subclasses_as_their_base_type_big_ints_and_a_flood_of_debug_output(verifier):
    tests = {
        "asserts": [
            "assert counts('aab') == {'a': 2, 'b': 1}",
            "assert point(1) == (1, 2) and ordered('ba') == {'b': 1, 'a': 1}",
            "assert sorted(evens(6), reverse=True) == [4, 2, 0]",
            "assert fact(2000) == math.factorial(2000)",
            "assert len(squares(5000)) == 5000 and squares(5000)[-1] == 4999 ** 2",
        ],
        "test_imports": ["import math"],
    }
    code = (
        "import collections, math\n"
        "for _ in range(20000):\n    print('debugging', _)\n"
        "def counts(s):\n    return collections.Counter(s)\n"
        "P = collections.namedtuple('P', 'x y')\ndef point(x):\n    return P(x, 2 * x)\n"
        "def ordered(s):\n    return collections.OrderedDict((c, 1) for c in s)\n"
        "def evens(n):\n    return (i for i in range(n) if i % 2 == 0)\n"
        "def fact(n):\n    return math.factorial(n)\n"
        "def squares(n):\n    return [i * i for i in range(n)]\n"
    )
    s = Sample(prompt_ids=[0], metadata={"tests": tests}, response=fenced(code))
    assert await verifier(s) == 1.0, s.evidence


def test_call_based_specs_are_refused_by_name():
    from slime.errors import PluginError
    from slime.rollout.verifiers.code import load_tests

    s = Sample(prompt_ids=[0], label=json.dumps({"fn_name": "solve", "inputs": [[1]], "outputs": [[2]]}), response="")
    with pytest.raises(PluginError, match="fn_name"):
        load_tests(s)
