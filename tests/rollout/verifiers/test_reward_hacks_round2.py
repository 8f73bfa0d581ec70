"""Reward hacks and bad specs found by the second red-team pass on the split code verifier (issue 26).

Each hack is a WRONG program that scored 1.0 on the split verifier before these fixes (commit c4b204e):
the expected value still reached the program through a name the test did not own (``from math import *``,
a bare ``isclose``), a method chained onto the solution's call (``.startswith('Hello, Bob')``) or a
keyword of a materializing builtin (``max(..., default=7)``, ``test_a_default_stays_with_the_judge``). Each is paired with the honest program for
the same spec, so a verifier that failed everything would not pass. Specs the verifier cannot judge and
values that would stall the judge are failures (``PluginError`` / reward 0), never scores.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from slime.errors import PluginError
from slime.rollout.tools.sandbox import Sandbox, sandbox_unavailable_reason
from slime.rollout.verifiers.code import CodeVerifier, outputs_match
from slime.rollout.verifiers.code_asserts import split_assert
from slime.types import Sample

pytestmark = pytest.mark.skipif(
    sandbox_unavailable_reason() is not None, reason=f"no OS sandbox: {sandbox_unavailable_reason()}"
)

AREA = {"asserts": ["assert isclose(area(2), 12.566, rel_tol=1e-3)", "assert isclose(area(1), 3.1416, rel_tol=1e-3)"]}
HONEST_AREA = "from math import isclose, pi\ndef area(r):\n    return pi * r * r\n"


@dataclasses.dataclass(frozen=True)
class Hack:
    name: str
    code: str
    spec: dict[str, Any]
    honest: str


HACKS = [
    Hack(
        "from math import * in the setup, math.isclose patched",
        "import math\nmath.isclose = lambda *a, **k: True\ndef area(r):\n    return 0.0\n",
        {"test_imports": ["from math import *"], **AREA},
        "import math\ndef area(r):\n    return math.pi * r * r\n",
    ),
    Hack(
        "a bare isclose the program defines",
        "def isclose(*a, **k):\n    return True\ndef area(r):\n    return 0.0\n",
        AREA,
        HONEST_AREA,
    ),
    Hack(
        "a str subclass whose startswith is always true",
        "class S(str):\n    def startswith(self, *a):\n        return True\n    endswith = startswith\ndef greet(n):\n    return S('wrong')\n",
        {"asserts": ["assert greet('Bob').startswith('Hello, Bob')", "assert greet('Al').endswith('Al!')"]},
        "def greet(n):\n    return f'Hello, {n}!'\n",
    ),
    Hack(
        "a set subclass whose issuperset is always true",
        "class S(set):\n    def issuperset(self, o):\n        return True\ndef primes(n):\n    return S()\n",
        {"asserts": ["assert primes(10).issuperset({2, 3, 5, 7})"]},
        "def primes(n):\n    return {p for p in range(2, n) if all(p % d for d in range(2, p))}\n",
    ),
]


def fenced(code: str) -> str:
    return f"```python\n{code}```"


async def score(code: str, spec: dict[str, Any] | str) -> tuple[float, dict]:
    sample = Sample(prompt_ids=[0], metadata={"tests": spec}, response=fenced(code))
    sandbox = Sandbox(timeout_s=5.0, memory_bytes=256 << 20, max_output_bytes=1 << 20)  # what --rm-type code runs with
    reward = await CodeVerifier(sandbox, partial_credit=True)(sample)
    return reward, sample.evidence["verifier"]


@pytest.mark.parametrize("hack", HACKS, ids=[h.name for h in HACKS])
async def test_the_hack_scores_zero(hack):
    reward, evidence = await score(hack.code, hack.spec)
    assert reward == 0.0, evidence


@pytest.mark.parametrize("hack", HACKS, ids=[h.name for h in HACKS])
async def test_the_honest_program_passes(hack):
    reward, evidence = await score(hack.honest, hack.spec)
    assert reward == 1.0, evidence


@pytest.mark.parametrize(
    "spec, why",
    [
        (
            {"test_imports": ["from collections import *"], "asserts": ["assert char_count('aab') == Counter('aab')"]},
            "import \\*",
        ),
        ({"asserts": ["assert 1 + 1 == 2"]}, "calls nothing of the solution"),
        ({"inputs": ["1\n"], "outputs": [None]}, "must be a string"),
        ({"inputs": ["1\n"]}, "equal length"),
        ({"asserts": "assert f(1) == 1"}, "list of strings"),
        ({"asserts": [["assert f(1) == 1"]]}, "list of strings"),
        ({"setup": "import math", "asserts": ["assert f(1) == 1"]}, "list of strings"),
        ({"asserts": ["assert f(" + "(" * 5000 + "1" + ")" * 5000 + ") == 1"]}, "nested too deep|does not parse"),
        ([1, 2], "objects"),
    ],
    ids=[
        "star-import",
        "no-probe",
        "output-none",
        "outputs-missing",
        "asserts-str",
        "asserts-nested",
        "setup-str",
        "deep",
        "bad-list",
    ],
)
async def test_a_spec_the_verifier_cannot_judge_fails_the_sample_with_a_named_reason(spec, why):
    sample = Sample(prompt_ids=[0], metadata={"tests": spec}, response=fenced("def f(x):\n    return x\n"))
    with pytest.raises(PluginError, match=why):
        await CodeVerifier(Sandbox(timeout_s=2.0))(sample)
    assert sample.evidence["verifier"]["verdict"] == "error"


@pytest.mark.parametrize(
    "code, spec, why",
    [
        (
            "def big(n):\n    return [k * (2**61 - 1) for k in range(40000)]\n",
            {"asserts": ["assert set(big(1) + []) == {1}"]},
            "share one hash",
        ),
        (
            "def big(n):\n    return [[k] for k in range(100000)]\n",
            {"asserts": ["assert sum(big(1) + [], []) == [1]"]},
            "assertion failed",
        ),
        (
            "def big(n):\n    return 3 ** (n * 900_000)\n",
            {"asserts": ["assert big(1) % (big(1) // 2 + 1) == 1"]},
            "ValueError",
        ),
        (
            "def big(n):\n    return [7 ** 20_000] * 40\n",
            {"test_imports": ["import math"], "asserts": ["assert math.prod(big(1)) == 1"]},
            "ValueError",
        ),
    ],
    ids=["hash-flood-set", "quadratic-sum", "bigint-floordiv", "bigint-prod"],
)
async def test_values_that_would_stall_the_judge_fail_the_case(code, spec, why):
    """``big(1) + []`` keeps the builtin on the judge's side (a materializer of a bare probe runs in the program);
    ``sum`` of lists is linear now, so it is judged (wrong) rather than refused."""
    reward, evidence = await score(code, spec)
    assert reward == 0.0, evidence
    assert why in evidence["logs"], evidence


@pytest.mark.parametrize(
    "code, spec",
    [
        (
            "def f(n):\n    return {n}, {n: n}\n",
            {"asserts": ["assert isinstance(f(1)[0], set) and type(f(1)[1]) is dict and set([1, 1]) == f(1)[0]"]},
        ),
        ("def f(n):\n    return n << 3 ^ 1\n", {"asserts": ["assert f(2) == 2 << 3 ^ 1", "assert f(1) & 8 == 8"]}),
        ("def f(x):\n    return '%.2f' % x\n", {"asserts": ["assert f(0.5) == '%.2f' % 0.5"]}),
        (
            "import sys\ndef f():\n    return sys.float_info.max\n",
            {"test_imports": ["import sys"], "asserts": ["assert f() == sys.float_info.max"]},
        ),
        ("def f(x):\n    return x + 1\n", '{"asserts": ["assert f(1) == 2"]}'),
        ("print(int(input()) * 2)\n", {"inputs": [["3"]], "outputs": [["6"]]}),
        (
            "from math import isclose\ndef area(r):\n    return 3.14159 * r * r\n",
            {"asserts": ["assert isclose(area(1), 3.14159)"]},
        ),
        (
            "def mult(n):\n    return set(range(0, 20, n))\n",
            {"asserts": ["assert mult(5).issubset({0, 5, 10, 15, 20})"]},
        ),
    ],
    ids=[
        "isinstance-of-set-and-dict",
        "bitwise",
        "percent-of-constants",
        "float_info",
        "tests-as-json-text",
        "lines-lists",
        "isclose-imported-by-solution",
        "set-method",
    ],
)
async def test_honest_forms_the_judge_now_evaluates(code, spec):
    reward, evidence = await score(code, spec)
    assert reward == 1.0, evidence


@pytest.mark.parametrize(
    "expected, got, match",
    [
        ("1000000", "1000001", False),  # integers are exact: within 1e-6 relative is not the same count
        ("1000000", "1000000.0000001", False),
        ("1000000", "1_000_000", False),
        ("0.5", "nan", False),
        ("inf", "inf", True),  # the same text
        ("1e308", "1e999", False),  # an overflow to inf is no number
        ("0.333333", "0.3333333333", True),
        ("2.5", "2.5000001", True),
        ("3.0", "3", True),
    ],
)
def test_output_tokens_compare_integers_exactly_and_reals_within_tolerance(expected, got, match):
    assert outputs_match(expected, got) is match


def test_a_default_stays_with_the_judge():
    """``max(f([]), default=7)``: the program is asked for ``f([])`` only, never shown the 7."""
    assert split_assert("assert max(f([]), default=7) == 7").probes == ("f([])",)
    assert split_assert("assert sorted(f(3), reverse=True) == [3, 2]").probes == ("sorted(f(3), reverse=True)",)
