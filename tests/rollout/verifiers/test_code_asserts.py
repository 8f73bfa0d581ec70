"""Asserts are split into the program's part (probes) and ours (checks), and the harness's channel is read
strictly: the unit rules under the code verifier's reward-hack tests (no sandbox needed here)."""

from __future__ import annotations

import json

import pytest

from slime.errors import PluginError
from slime.rollout.tools.sandbox import Sandbox, sandbox_unavailable_reason
from slime.rollout.verifiers.code import CodeVerifier
from slime.rollout.verifiers.code_asserts import judge_case, parse_setup, split_assert
from slime.rollout.verifiers.code_harness import decode_value, harness_request, read_channel
from slime.types import Sample


@pytest.mark.parametrize(
    ("source", "probes"),
    [
        ("assert add(1, 2) == 3", ("add(1, 2)",)),
        ("assert set(uniq([1, 1])) == set([1])", ("set(uniq([1, 1]))",)),
        ("assert math.isclose(area(2), 12.56, rel_tol=0.01)", ("area(2)",)),
        ("assert len(f(x=3)) == 2 and g(1)[0] is None", ("len(f(x=3))", "g(1)[0]")),
        ("assert not is_prime(4)", ("is_prime(4)",)),
        ("assert Solver().run('a') == 'b'", ("Solver().run('a')",)),
        ("assert f(1) == 2\nassert f(2) == 4", ("f(1)", "f(2)")),
    ],
)
def test_probes_are_the_solution_rooted_parts_and_never_the_expected_side(source, probes):
    split = split_assert(source)
    assert split.probes == probes
    assert not any("== " in p or "12.56" in p for p in split.probes)


def test_math_and_builtins_are_never_the_solutions_even_if_it_defines_them():
    assert split_assert("assert math.floor(f(2.5)) == 2").probes == ("f(2.5)",)
    assert split_assert("assert sorted(f(3)) == [1, 2, 3]").probes == ("sorted(f(3))",)
    assert split_assert("assert round(f(3), 2) == 1.5").probes == ("f(3)",)  # round(x, 2) has a non-probe argument


def test_setup_imports_bind_names_used_inside_probes_and_math_names_for_the_checks():
    setup = parse_setup(["import collections", "from heapq import heappush as hp", "from math import isclose, inf"])
    assert setup.names == {"collections", "hp", "isclose", "inf"}
    assert split_assert("assert f(collections.Counter('aab')) == 2", setup).probes == ("f(collections.Counter('aab'))",)
    case = split_assert("assert isclose(f(1), 0.5) and g(2) == inf", setup)
    assert case.probes == ("f(1)", "g(2)")
    assert judge_case(case, [(True, 0.5), (True, float("inf"))]) == (True, "ok")
    with pytest.raises(PluginError, match="may only import"):
        parse_setup(["EXPECTED = [3, 17]"])


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("f(1) == 2", "not a sequence of assert statements"),
        ("assert all(f(x) == x for x in range(3))", "GeneratorExp"),
        ("assert f(1) == (lambda: 2)()", "Lambda"),
        ("assert re.match('a', f(1))", "reads .match"),
        ("assert f(1) == 'a'.center(9)", "reads .center"),
        ("assert f(1) == EXPECTED[1]", "names 'EXPECTED' without calling it"),
        ("assert min_cost([]) == inf", "names 'inf' without calling it"),
        ("assert squares([1, 2]) == list(map(lambda x: x * x, [1, 2]))", "builtin 'map'"),
        ("assert CONST == 4", "names 'CONST' without calling it"),
        ("assert f(1) == [i for i in range(3)]", "ListComp"),
        ("assert f(1) ==", "does not parse"),
    ],
)
def test_forms_the_verifier_cannot_judge_outside_the_program_are_refused_by_name(source, why):
    with pytest.raises(PluginError, match=why):
        split_assert(source)


def _ok(*values):
    return [(True, v) for v in values]


def test_judge_compares_plain_values_as_python_does():
    case = split_assert("assert f(1) == 3 and math.isclose(g(2), 0.3, rel_tol=1e-6)")
    assert judge_case(case, _ok(3, 0.1 + 0.2)) == (True, "ok")
    ok, why = judge_case(case, _ok(4, 0.3))
    assert not ok and "f(1) returned 4" in why and "assertion failed" in why
    assert judge_case(split_assert("assert len(f(1)) == 2"), _ok(5))[0] is False  # len(f(1)) is one probe: 5 == 2


@pytest.mark.parametrize(
    "source",
    [
        "assert first_n(5) == list(range(5))",
        "assert to_char(65) == chr(65)",
        "assert power(2, 10) == pow(2, 10)",
        "assert count_bits(5) == bin(5).count('1')",
        "assert pairs([1, 2], 'ab') == list(zip([1, 2], 'ab'))",
        "assert joined(['a', 'b']) == ','.join(['a', 'b']) == 'a,b'.split(',')[0] + ',b'",
        "assert big(1) < sys.maxsize and letters(1) == string.ascii_lowercase[:1]",
    ],
)
def test_builtins_on_the_expected_side_are_the_tests_and_evaluated_here(source):
    case = split_assert(source)
    assert len(case.probes) in (1, 2) and all("(" in p for p in case.probes)
    assert not any(p.startswith(("list(", "chr(", "pow(", "bin(", "','", "sys", "string")) for p in case.probes)


def test_a_probe_that_raised_fails_the_case_only_where_the_check_reaches_it():
    case = split_assert("assert safe_div(1, 0) is None or inv(0) == 0")
    assert judge_case(case, [(True, None), (False, "raised ZeroDivisionError: x")]) == (True, "ok")
    ok, why = judge_case(case, [(True, 1.0), (False, "raised ZeroDivisionError: x")])
    assert not ok and "ZeroDivisionError" in why


@pytest.mark.parametrize(
    ("source", "value", "why"),
    [
        ("assert 'ab' * n(1) == 'abab'", 10**12, "repetition"),
        ("assert math.factorial(n(1)) > 0", 10**9, "factorial"),
        ("assert next_odd(4) % 2 == 1", "%1500000000d", "formatting"),
        ("assert len(range(n(1))) > 0", 10**12, "range"),
        ("assert n(1) ** 4096 > 0", 10**4000, "power"),
        ("assert bytes(n(1)) == b''", 10**10, "bytes"),
        ("assert s(1).replace('a', 'bb') == ''", "a" * 2_000_000, "replace"),
    ],
)
def test_judge_bounds_what_the_programs_values_can_make_it_build(source, value, why):
    ok, log = judge_case(split_assert(source), _ok(value))
    assert not ok and why in log


def _frames(*frames) -> str:
    return "".join(json.dumps(f) + "\n" for f in frames)


def test_the_channel_is_accepted_only_in_the_harnesss_exact_sequence():
    good = _frames(
        {"loaded": True}, {"probe": 0, "value": 3}, {"probe": 1, "raised": "ZeroDivisionError: x"}, {"done": 2}
    )
    report = read_channel(good, 2)
    assert report.problem is None and report.outcomes == ((True, 3), (False, "raised ZeroDivisionError: x"))
    early = _frames({"loaded": True}, {"probe": 0, "value": True})
    assert "ended before" in (read_channel(early, 2).problem or "")
    duplicate = _frames({"loaded": True}, {"probe": 0, "value": 1}, {"probe": 0, "value": 1}, {"done": 2})
    assert "did not write" in (read_channel(duplicate, 2).problem or "")
    after = good + _frames({"probe": 0, "value": 1})
    assert "after the harness finished" in (read_channel(after, 2).problem or "")
    assert "did not write" in (read_channel("All tests passed\n", 0).problem or "")
    assert "before any test ran" in (
        read_channel(_frames({"load_error": "SyntaxError: x"}, {"done": 0}), 1).problem or ""
    )
    huge_json_int = '{"loaded": true}\n{"probe": 0, "value": ' + "9" * 5000 + '}\n{"done": 1}\n'
    assert "did not write" in (read_channel(huge_json_int, 1).problem or "")  # json's digit limit is a ValueError


def test_program_written_text_in_the_evidence_is_valid_utf8():
    report = read_channel(_frames({"loaded": True}, {"probe": 0, "raised": "ValueError: \udcff"}, {"done": 1}), 1)
    ((ok, why),) = report.outcomes
    assert not ok and why.encode("utf-8")  # a lone surrogate would make the rollout records unwritable


def test_values_decode_to_plain_builtins_and_nothing_else():
    encoded = {"dict": [[{"tuple": [1, "a"]}, {"set": [float("nan"), None, True]}]]}
    value = decode_value(encoded)
    ((key, members),) = value.items()
    assert key == (1, "a") and type(members) is set and None in members
    assert decode_value({"hexint": hex(10**5000)}) == 10**5000 and decode_value([1, [2.5]]) == [1, [2.5]]
    for bad in ({"object": "x"}, {"hexint": 3}, {"set": [[]]}, {"tuple": [], "set": []}, {"complex": ["1", "2"]}):
        with pytest.raises((ValueError, TypeError)):
            decode_value(bad)


def test_the_request_carries_probes_and_setup_but_no_expected_value():
    case = split_assert("assert mystery(3) == 17")
    assert "17" not in harness_request(["import math"], case.probes)


requires_bwrap = pytest.mark.skipif(
    sandbox_unavailable_reason() is not None, reason=f"no OS sandbox: {sandbox_unavailable_reason()}"
)


@requires_bwrap
async def test_honest_programs_of_many_shapes_pass():
    tests = {
        "test_imports": ["import math"],
        "asserts": [
            "assert list(evens(5)) == [0, 2, 4]",  # a generator, materialized beside the program
            "assert pair(1) == (1, 'one') and pair(2)[1] == 'two'",
            "assert counts('aab') == {'a': 2, 'b': 1}",
            "assert is_even(3) is False and not is_even(5)",
            "assert math.isclose(half(1), 0.5) and nothing() is None",
            "assert blob() == b'\\x00\\xff' and big() == 2 ** 100 and set(evens(3)) == {0, 2}",
        ],
    }
    code = (
        "print('debug output is fine')\n"
        "def evens(n):\n    return (i for i in range(n) if i % 2 == 0)\n"
        "def pair(n):\n    return (n, {1: 'one', 2: 'two'}[n])\n"
        "def counts(s):\n    return {c: s.count(c) for c in sorted(set(s))}\n"
        "def is_even(n):\n    return n % 2 == 0\n"
        "def half(x):\n    return x / 2\n"
        "def nothing():\n    return None\n"
        "def blob():\n    return bytes([0, 255])\n"
        "def big():\n    return 2 ** 100\n"
    )
    sample = Sample(prompt_ids=[0], metadata={"tests": tests}, response=f"```python\n{code}```")
    assert await CodeVerifier(Sandbox(timeout_s=2.0))(sample) == 1.0, sample.evidence
