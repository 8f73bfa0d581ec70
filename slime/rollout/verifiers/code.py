"""The ``code`` verifier: run the response's program against test cases in the sandbox.

Code: the last fenced block of ``sample.response`` (```` ```python ```` preferred, else any ```` ``` ````).
Test cases, from ``sample.metadata["tests"]`` or else ``sample.label`` (a JSON string), in one of:

* ``{"inputs": [stdin, ...], "outputs": [stdout, ...]}`` (APPS / CodeContests): the program reads
  stdin; its stdout must equal the expected text up to trailing whitespace on each line and
  blank lines at the end;
* ``{"asserts": ["assert f(2) == 4", ...]}`` (MBPP-style; ``test_list`` is read too; optional ``"setup"``
  or ``test_imports``: import lines the asserts need): judged outside the program (below);
* a list of ``{"input": ..., "output": ...}`` objects.

Each stdin case is one sandbox run (``slime/rollout/tools/sandbox.py``: bubblewrap namespaces and limits;
it states what it does not protect against); its stdout is compared here, so an exit status alone never
passes. The asserts of a sample run in one sandbox run under the harness of ``code_harness.py``: the
program sees only the calls of each assert (``add(1, 2)``), never the expected values nor the assert
text; it sends back what they returned as plain built-in values, and ``code_asserts.judge`` compares them
here, by type and value (no ``__eq__`` of the program's, no patched builtin, an early exit fails).
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
import re
from collections.abc import AsyncIterator
from typing import Any

from slime.errors import PluginError
from slime.rollout.tools.sandbox import Sandbox, SandboxResult
from slime.rollout.verifiers.code_asserts import SplitAssert, judge, setup_names, split_assert
from slime.rollout.verifiers.code_harness import harness_program, harness_request, read_channel
from slime.types import Sample

__all__ = ["CodeVerifier", "CodeCase", "extract_code", "load_tests", "outputs_match"]

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
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
    blocks = _FENCE.findall(response)
    if not blocks:
        return None
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [body for _, body in blocks])[-1]


def load_tests(sample: Sample) -> list[CodeCase]:
    """Test cases of ``sample`` (module docstring). Raises PluginError naming the shape problem."""
    spec: Any = sample.metadata.get("tests")
    if spec is None and sample.label:
        try:
            spec = json.loads(sample.label)
        except json.JSONDecodeError as exc:
            raise PluginError(f"code verifier: label is not JSON test cases ({exc.msg})") from None
    if spec is None:
        raise PluginError("code verifier: no test cases (metadata['tests'] or a JSON label)")
    if isinstance(spec, list):
        spec = {"inputs": [c.get("input", "") for c in spec], "outputs": [c.get("output") for c in spec]}
    if not isinstance(spec, dict):
        raise PluginError(f"code verifier: test cases must be an object or a list, got {type(spec).__name__}")
    asserts = spec.get("asserts", spec.get("test_list"))
    if asserts is not None:
        setup = tuple(str(line) for line in spec.get("setup", spec.get("test_imports")) or ())
        names = setup_names(setup)
        return [CodeCase(assertion=split_assert(str(a), names), setup=setup) for a in asserts]
    inputs, outputs = spec.get("inputs"), spec.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise PluginError("code verifier: expected 'inputs' and 'outputs' lists of equal length, or 'asserts'")
    return [CodeCase(stdin=str(i), expected_stdout=str(o)) for i, o in zip(inputs, outputs)]


def outputs_match(expected: str, got: str) -> bool:
    """Equal up to trailing whitespace on each line and trailing blank lines."""

    def norm(text: str) -> list[str]:
        lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    return norm(expected) == norm(got)


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
        evidence.update(verdict=f"passed {passed}/{len(tests)}", logs=first_failure[:_MAX_EVIDENCE_CHARS] or "all cases passed")
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

    async def _judge_asserts(self, code: str, cases: list[SplitAssert], setup: tuple[str, ...]) -> list[tuple[bool, str]]:
        """Run every case's probes in one harness run, then judge each case here (``code_harness``)."""
        probes = [p for case in cases for p in case.probes]
        result = await self.sandbox.run(harness_program(code), stdin=harness_request(setup, probes))
        problem = _run_problem(result)
        report = read_channel(result.stdout, len(probes)) if problem is None else None
        problem = problem or (report.problem if report is not None else None)
        if problem is not None or report is None:
            return [(False, f"{case.source[:200]!r}: {problem}") for case in cases]
        verdicts, start = [], 0
        for case in cases:
            outcomes = report.outcomes[start : start + len(case.probes)]
            start += len(case.probes)
            failed = [(probe, why) for probe, (ok, why) in zip(case.probes, outcomes) if not ok]
            if failed:
                verdicts.append((False, f"{case.source[:200]!r}: {failed[0][0]} {failed[0][1]}"))
            else:
                verdicts.append(judge(case, [value for _, value in outcomes]))
        return verdicts

    async def _run_io_case(self, code: str, case: CodeCase) -> tuple[bool, str]:
        result = await self.sandbox.run(code, stdin=case.stdin)
        if not result.ok:
            return False, f"stdin {case.stdin[:200]!r}: {_describe(result)}"
        expected = case.expected_stdout or ""
        ok = outputs_match(expected, result.stdout)
        return ok, f"stdin {case.stdin[:200]!r}: expected {expected[:200]!r}, got {result.stdout[:200]!r}"


def _run_problem(result: SandboxResult) -> str | None:
    """Why a harness run does not count before its channel is read (time, output cap, exit status)."""
    if result.timed_out or result.returncode != 0:
        return _describe(result)
    if result.truncated:
        return "its results exceeded the sandbox's output limit"
    return None


def _describe(result: SandboxResult) -> str:
    if result.timed_out:
        return f"killed after {result.elapsed_s:.1f}s (time limit)"
    if result.returncode == 0:
        return "ok"
    tail = " | ".join(result.stderr.strip().splitlines()[-3:])
    return f"exit status {result.returncode}: {tail[-500:]}"
