"""The ``code`` verifier: run the response's program against test cases in the sandbox.

Code: the last fenced block of ``sample.response`` (```` ```python ```` preferred, else any ```` ``` ````).
Test cases, from ``sample.metadata["tests"]`` or else ``sample.label`` (a JSON string), in one of:

* ``{"inputs": [stdin, ...], "outputs": [stdout, ...]}`` (APPS / CodeContests): the program reads
  stdin (a string or a list of lines); its stdout must hold the expected whitespace-separated tokens
  in order, integers exactly and real numbers within ``FLOAT_TOLERANCE`` (``outputs_match``: as contest
  checkers compare);
* ``{"asserts": ["assert f(2) == 4", ...]}`` (MBPP-style; ``test_list`` is read too; optional ``setup`` /
  ``test_imports`` lists and ``test_setup_code``: import lines the asserts need, nothing else);
* a list of ``{"input": ..., "output": ...}`` objects; any of these as JSON text.
Call-based specs (``fn_name``) are refused with a ``PluginError``.

Each stdin case is one sandbox run (``slime/rollout/tools/sandbox.py``: bubblewrap namespaces and limits;
it states what it does not protect against); its stdout is compared here, so an exit status alone never
passes. The asserts of a sample run in one sandbox run under the harness of ``code_harness.py``: the
program sees only the calls of each assert (``add(1, 2)``, split off by ``code_asserts.py``), never the
expected values nor the assert text; it sends back what they returned as plain built-in values, and
``code_judge.py`` evaluates the rest of each assert here over them (no ``__eq__`` of the program's, no
patched builtin or module, an early exit fails). An assert form the judge cannot evaluate outside the
program (a comprehension, a lambda, a name it neither owns nor calls) is a ``PluginError`` naming it.
The time limit is the sandbox's, for the whole program with all its asserts.

Reward: 1.0 when every case passes, else 0.0; with ``partial_credit`` the fraction passed (then every
stdin case runs; otherwise the first failure stops the check). Evidence:
``{"checked": {"kind", "num_tests", "code"}, "verdict": "passed 3/4" | "no_code" | "no_tests" |
"error", "logs": "<the first failing case: input, expected, got, stderr tail>"}``; test cases that
cannot be read raise ``PluginError`` (verdict ``error``), so the sample is FAILED rather than scored.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import AsyncIterator
from typing import Any

from slime.errors import PluginError
from slime.rollout.tools.sandbox import Sandbox, SandboxResult
from slime.rollout.verifiers.code_asserts import SplitAssert, judge_case, parse_setup, split_assert
from slime.rollout.verifiers.code_harness import harness_program, harness_request, read_channel, script_program
from slime.types import Sample

__all__ = ["CodeVerifier", "CodeCase", "extract_code", "load_tests", "outputs_match"]

_FENCE = "```"
_LANG = re.compile(r"[A-Za-z0-9_+-]*")
_MAX_EVIDENCE_CHARS = 2000


@dataclasses.dataclass(frozen=True)
class CodeCase:
    """``stdin``/``expected_stdout`` for an I/O case; ``assertion`` (Python source, split into what the
    program computes and what is judged here) and its ``setup`` imports for an assert case."""

    stdin: str = ""
    expected_stdout: str | None = None
    assertion: SplitAssert | None = None
    setup: tuple[str, ...] = ()


def extract_code(response: str) -> str | None:
    """The last ```` ```python ```` block, else the last fenced block, else None."""
    blocks = fenced_blocks(response)
    if not blocks:
        return None
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [body for _, body in blocks])[-1]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced block of ``text``: a fence, an info line whose leading
    ``[A-Za-z0-9_+-]*`` is the language, then the body up to the next fence. One pass of ``str.find``:
    linear in ``len(text)`` (a regex with overlapping quantifiers over the info line took 5.7 s on a
    100k-character line without a newline, inside the event loop). Example: "```py x\nprint(1)\n```" ->
    [("py", "print(1)\n")]."""
    blocks, pos = [], 0
    while (start := text.find(_FENCE, pos)) != -1:
        eol = text.find("\n", start + len(_FENCE))
        end = text.find(_FENCE, eol + 1) if eol != -1 else -1
        if end == -1:  # no later fence can close either: its body would have to start on this same line
            break
        lang = _LANG.match(text, start + len(_FENCE), eol)
        blocks.append((lang.group() if lang else "", text[eol + 1 : end]))
        pos = end + len(_FENCE)
    return blocks


def load_tests(sample: Sample) -> list[CodeCase]:
    """Test cases of ``sample`` (module docstring). Raises PluginError naming the shape problem."""
    spec = _spec_object(sample)
    if spec.get("fn_name"):
        raise PluginError(
            "code verifier: call-based tests ('fn_name', APPS/LeetCode style) are not supported; give stdin cases or asserts"
        )
    asserts = spec.get("asserts", spec.get("test_list"))
    if asserts is not None:
        setup = parse_setup(_setup_lines(spec))
        return [CodeCase(assertion=split_assert(a, setup), setup=setup.lines) for a in _strings(asserts, "asserts")]
    inputs, outputs = spec.get("inputs"), spec.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise PluginError("code verifier: expected 'inputs' and 'outputs' lists of equal length, or 'asserts'")
    return [CodeCase(stdin=_text(i, "input"), expected_stdout=_text(o, "output")) for i, o in zip(inputs, outputs)]


def _spec_object(sample: Sample) -> dict[str, Any]:
    """The test-case object of ``sample``: ``metadata["tests"]`` (an object, a list of cases, or their
    JSON text), else the JSON label; a list of ``{"input", "output"}`` cases as ``inputs``/``outputs``."""
    spec: Any = sample.metadata.get("tests")
    if spec is None and sample.label:
        spec = sample.label
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except (json.JSONDecodeError, RecursionError) as exc:
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deep"
            raise PluginError(f"code verifier: the test cases are not JSON ({why})") from None
    if spec is None:
        raise PluginError("code verifier: no test cases (metadata['tests'] or a JSON label)")
    if isinstance(spec, list):
        if not all(isinstance(c, dict) for c in spec):
            raise PluginError("code verifier: a list of test cases must hold {'input': ..., 'output': ...} objects")
        spec = {"inputs": [c.get("input", "") for c in spec], "outputs": [c.get("output") for c in spec]}
    if not isinstance(spec, dict):
        raise PluginError(f"code verifier: test cases must be an object or a list, got {type(spec).__name__}")
    return spec


def _strings(value: object, field: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PluginError(f"code verifier: {field!r} must be a list of strings")
    return value


def _text(value: object, field: str) -> str:
    """A case's stdin or expected stdout: a string, or a list of lines (joined by newlines); a lone
    surrogate (JSON ``"\\ud800"``) becomes U+FFFD, since the sandbox writes UTF-8."""
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        value = "\n".join(value) + "\n"
    if not isinstance(value, str):
        raise PluginError(
            f"code verifier: a test {field} must be a string or a list of lines, got {type(value).__name__}"
        )
    return value.encode("utf-8", "replace").decode("utf-8")


def _setup_lines(spec: dict[str, Any]) -> list[str]:
    """``setup`` / ``test_imports`` (lists of lines) and MBPP's ``test_setup_code`` (one string)."""
    lines = spec.get("setup", spec.get("test_imports")) or []
    lines = _strings(lines, "setup")
    code = spec.get("test_setup_code")
    return lines + ([code] if isinstance(code, str) and code.strip() else [])


FLOAT_TOLERANCE = 1e-6
"""Absolute or relative difference under which two real-number output tokens are equal."""
_INTEGER = re.compile(r"[+-]?\d+")
_REAL = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def outputs_match(expected: str, got: str) -> bool:
    """Equal as contest checkers compare: the same whitespace-separated tokens in order (so line breaks
    and runs of spaces do not matter), each equal as text or, where the expected token is a real number
    (a ``.`` or an exponent), within ``FLOAT_TOLERANCE`` (``0.333333`` matches ``0.3333333333``).
    Integers compare exactly (``1000001`` is not ``1000000``); ``nan``, ``inf`` and ``1_000`` are text."""
    want, have = expected.split(), got.split()
    return len(want) == len(have) and all(_tokens_match(a, b) for a, b in zip(want, have))


def _tokens_match(want: str, have: str) -> bool:
    if want == have:
        return True
    if _INTEGER.fullmatch(want) or not (_REAL.fullmatch(want) and _REAL.fullmatch(have)):
        return False
    a, b = float(want), float(have)  # finite: the pattern has no nan/inf, and 1e999 overflows to inf below
    return (
        math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)
    )


class CodeVerifier:
    """``await CodeVerifier(sandbox)(sample) -> float`` (see the module docstring).

    Args:
        sandbox: where programs run (default: ``Sandbox()``, 5 s and 1 GiB per case; raises
            ``SandboxUnavailable`` where bubblewrap cannot run).
        partial_credit: reward the fraction of cases passed instead of all-or-nothing.
    """

    def __init__(self, sandbox: Sandbox | None = None, *, partial_credit: bool = False):
        self.sandbox = sandbox or Sandbox()
        self.partial_credit = partial_credit

    async def __call__(self, sample: Sample) -> float:
        code = extract_code(sample.response)
        if code is not None:  # a lone surrogate from a detokenizer cannot be written as UTF-8
            code = code.encode("utf-8", "replace").decode("utf-8")
        evidence: dict[str, Any] = {
            "checked": {"kind": "code", "num_tests": 0, "code": (code or "")[:_MAX_EVIDENCE_CHARS]},
            "verdict": "error",
            "logs": "",
        }
        sample.evidence["verifier"] = evidence
        try:
            tests = load_tests(sample)
        except PluginError as exc:
            evidence["logs"] = str(exc)
            raise
        evidence["checked"]["num_tests"] = len(tests)
        if code is None:
            evidence.update(verdict="no_code", logs="no fenced code block in the response")
            return 0.0
        if not tests:
            evidence.update(verdict="no_tests", logs="the sample has an empty list of test cases")
            return 0.0
        passed, first_failure = 0, ""
        async for i, ok, log in self._results(code, tests):
            passed += ok
            if not ok and not first_failure:
                first_failure = f"case {i}: {log}"
                if not self.partial_credit:
                    break
        evidence.update(
            verdict=f"passed {passed}/{len(tests)}", logs=first_failure[:_MAX_EVIDENCE_CHARS] or "all cases passed"
        )
        if self.partial_credit:
            return passed / len(tests)
        return 1.0 if passed == len(tests) else 0.0

    async def _results(self, code: str, tests: list[CodeCase]) -> AsyncIterator[tuple[int, bool, str]]:
        """(case index, passed, log) per case: all assert cases from one harness run, stdin cases one by one."""
        asserts = [(i, case.assertion) for i, case in enumerate(tests) if case.assertion is not None]
        if asserts:
            verdicts = await self._judge_asserts(code, [a for _, a in asserts], tests[asserts[0][0]].setup)
            for (i, _), (ok, log) in zip(asserts, verdicts):
                yield i, ok, log
        for i, case in enumerate(tests):
            if case.assertion is None:
                ok, log = await self._run_io_case(code, case)
                yield i, ok, log

    async def _judge_asserts(
        self, code: str, cases: list[SplitAssert], setup: tuple[str, ...]
    ) -> list[tuple[bool, str]]:
        """Run every case's probes in one harness run, then judge each case here (``code_harness``)."""
        probes = [p for case in cases for p in case.probes]
        result = await self.sandbox.run(harness_program(code), stdin=harness_request(setup, probes))
        problem = _run_problem(result)
        report = read_channel(result.stdout, len(probes)) if problem is None else None
        problem = problem or (report.problem if report is not None else None)
        if problem is not None or report is None:
            if result.truncated:
                problem = f"{problem} (the sandbox's output limit of {self.sandbox.max_output_bytes} bytes was reached)"
            return [(False, f"{case.source[:200]!r}: {problem}") for case in cases]
        verdicts, start = [], 0
        for case in cases:
            verdicts.append(judge_case(case, report.outcomes[start : start + len(case.probes)]))
            start += len(case.probes)
        return verdicts

    async def _run_io_case(self, code: str, case: CodeCase) -> tuple[bool, str]:
        result = await self.sandbox.run(script_program(code), stdin=case.stdin)
        if not result.ok:
            return False, f"stdin {case.stdin[:200]!r}: {_describe(result)}"
        expected = case.expected_stdout or ""
        ok = outputs_match(expected, result.stdout)
        cut = " (cut at the sandbox's output limit)" if result.truncated else ""
        return ok, f"stdin {case.stdin[:200]!r}: expected {expected[:200]!r}, got {result.stdout[:200]!r}{cut}"


def _run_problem(result: SandboxResult) -> str | None:
    """Why a harness run does not count before its channel is read (time, exit status); a channel cut at
    the output limit shows as a problem of the channel itself."""
    if result.timed_out or result.returncode != 0:
        return _describe(result)
    return None


def _describe(result: SandboxResult) -> str:
    if result.timed_out:
        return f"killed after {result.elapsed_s:.1f}s (time limit)"
    if result.returncode == 0:
        return "ok"
    tail = " | ".join(result.stderr.strip().splitlines()[-3:])
    return f"exit status {result.returncode}: {tail[-500:]}"
