"""The program the code verifier runs in the sandbox for assert tests, and how its answers are read.

The sandbox runs ``harness_program(solution)``: a harness with the solution's source embedded as a
string. On stdin it gets ``harness_request(setup, probes)``, the case's setup imports and the probe
expressions (``code_asserts``: the solution's calls, never the expected values). It then

1. reads stdin whole, points the program's stdin at ``/dev/null`` and its stdout at stderr, keeping the
   original stdout as the result channel, so nothing the program prints lands on the channel;
2. runs the solution, then the setup, in one namespace (``__name__ == "__main__"``, as a script);
3. evaluates each probe there and writes one JSON line per probe to the channel: its value encoded from
   built-in types only (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``,
   ``tuple``, ``set``, ``frozenset``, ``dict``; matched by exact type, so a subclass or an object with its
   own ``__eq__`` is refused), or the exception it raised (any ``BaseException``: ``SystemExit`` too);
4. writes ``{"done": n}`` and ends with ``os._exit(0)`` (no ``atexit`` hook or thread of the solution runs).

The solution shares the harness's process, so it can write to the channel or rewrite the harness: what
makes that useless is that the expected values never enter the sandbox. ``read_channel`` accepts only
the exact frame sequence above (loaded, one frame per probe in order, done, nothing after, exit status
0); anything else, an early exit included, fails the sample. Values are rebuilt in our process as plain
built-ins (``decode_value``) and judged there (``code_asserts.judge``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["ChannelReport", "decode_value", "harness_program", "harness_request", "read_channel"]

_MAX_DEPTH = 64
"""Deepest nesting of a returned value that is encoded (and decoded)."""

_HARNESS = r"""
import json as _json, os as _os, sys as _sys

_ATOMS = {type(None): None, bool: None, str: None}
_TAGGED = {int: "int", float: "float", complex: "complex", bytes: "bytes"}
_CONTAINERS = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}


def _encode(value, depth):
    kind = type(value)
    if depth > MAX_DEPTH:
        raise ValueError("a value nested deeper than %d" % MAX_DEPTH)
    if kind in _ATOMS:
        return value
    if kind is int:
        return {"int": str(value)}
    if kind is float:
        return {"float": repr(value)}
    if kind is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind in _CONTAINERS:
        return {_CONTAINERS[kind]: [_encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in value.items()]}
    raise TypeError("returned a %s (only built-in values are compared)" % kind.__name__)


def _describe(exc):
    try:
        return "%s: %s" % (type(exc).__name__, str(exc)[:300])
    except BaseException:
        return type(exc).__name__


def _harness(solution):
    request = _json.loads(_sys.stdin.buffer.read().decode("utf-8"))
    channel = _os.dup(1)
    _os.dup2(2, 1)  # the program's prints go to stderr, never onto the channel
    null = _os.open(_os.devnull, _os.O_RDONLY)
    _os.dup2(null, 0)
    _os.close(null)

    def send(frame):
        data = (_json.dumps(frame) + "\n").encode("utf-8")
        while data:
            data = data[_os.write(channel, data):]

    def finish(count):
        send({"done": count})
        try:
            _sys.stdout.flush()
            _sys.stderr.flush()
        finally:
            _os._exit(0)

    namespace = {"__name__": "__main__", "__file__": __file__, "__builtins__": __builtins__}
    try:
        exec(compile(solution, "solution.py", "exec"), namespace)
        for line in request["setup"]:
            exec(compile(line, "<test setup>", "exec"), namespace)
    except BaseException as exc:
        send({"load_error": _describe(exc)})
        finish(0)
    send({"loaded": True})
    for k, probe in enumerate(request["probes"]):
        try:
            value = eval(compile(probe, "<test>", "eval"), namespace)
        except BaseException as exc:
            send({"probe": k, "raised": _describe(exc)})
            continue
        try:
            send({"probe": k, "value": _encode(value, 0)})
        except BaseException as exc:
            send({"probe": k, "unencodable": _describe(exc)})
    finish(len(request["probes"]))


_harness(SOLUTION)
"""


def harness_program(solution: str) -> str:
    """The sandbox program for assert tests: the harness with ``solution`` (Python source) embedded."""
    return _HARNESS.replace("MAX_DEPTH", str(_MAX_DEPTH)).replace("SOLUTION", repr(solution)) + "\n"


def harness_request(setup: Sequence[str], probes: Sequence[str]) -> str:
    """The harness's stdin: the setup imports and the probe expressions (no expected value)."""
    return json.dumps({"setup": list(setup), "probes": list(probes)})


@dataclasses.dataclass(frozen=True)
class ChannelReport:
    """What the harness said, read strictly.

    Attributes:
        problem: why the whole run does not count (an early exit, a load error, frames the harness did
            not write, ...), or None.
        outcomes: per probe, ``(True, value)`` or ``(False, "raised ZeroDivisionError: ...")``.
    """

    problem: str | None
    outcomes: tuple[tuple[bool, Any], ...] = ()


def read_channel(channel: str, num_probes: int) -> ChannelReport:
    """Parse the harness's channel (the sandbox's stdout) for ``num_probes`` probes (module docstring)."""
    try:
        frames = [json.loads(line) for line in channel.splitlines() if line]
    except (json.JSONDecodeError, RecursionError):
        return ChannelReport("the result channel holds lines the verifier did not write")
    if not frames or not isinstance(frames[0], dict):
        return ChannelReport("the program ended before the harness reported (an early exit or a crash)")
    if "load_error" in frames[0]:
        return ChannelReport(f"the program raised {str(frames[0]['load_error'])[:400]} before any test ran")
    if frames[0] != {"loaded": True}:
        return ChannelReport("the result channel holds lines the verifier did not write")
    body, rest = frames[1 : 1 + num_probes], frames[1 + num_probes :]
    if len(body) < num_probes or rest[:1] != [{"done": num_probes}]:
        ended = "the program ended before the verifier's last test (an early exit, a crash, or killed)"
        return ChannelReport(ended if len(frames) < num_probes + 2 else "the result channel holds lines the verifier did not write")
    if len(rest) > 1:
        return ChannelReport("the result channel holds lines after the harness finished")
    outcomes = [_outcome(frame, k) for k, frame in enumerate(body)]
    if any(o is None for o in outcomes):
        return ChannelReport("the result channel holds lines the verifier did not write")
    return ChannelReport(None, tuple(o for o in outcomes if o is not None))


def _outcome(frame: Any, k: int) -> tuple[bool, Any] | None:
    if not isinstance(frame, dict) or frame.get("probe") != k or len(frame) != 2:
        return None
    if "raised" in frame:
        return False, f"raised {str(frame['raised'])[:400]}"
    if "unencodable" in frame:
        return False, str(frame["unencodable"]).removeprefix("TypeError: ")[:400]
    try:
        return True, decode_value(frame["value"])
    except (KeyError, TypeError, ValueError, OverflowError, RecursionError):
        return None


def decode_value(obj: Any, depth: int = 0) -> Any:
    """A built-in value from the harness's encoding (module docstring).

    Raises:
        ValueError / TypeError: anything the harness would not have written (a bad tag, an unhashable set
            member, an int past Python's digit limit, nesting past the limit).
    """
    if depth > _MAX_DEPTH:
        raise ValueError("nested too deep")
    if obj is None or isinstance(obj, bool | str):
        return obj
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError(f"not an encoded value: {obj!r:.80}")
    ((tag, body),) = obj.items()
    if tag in _SCALARS:
        return _SCALARS[tag](body)
    if tag == "dict" and isinstance(body, list):
        return {decode_value(k, depth + 1): decode_value(v, depth + 1) for k, v in (_pair(p) for p in body)}
    if tag in _SEQUENCES and isinstance(body, list):
        return _SEQUENCES[tag](decode_value(v, depth + 1) for v in body)
    raise ValueError(f"unknown tag {tag!r:.40}")


def _pair(item: Any) -> tuple[Any, Any]:
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError("a dict item is not a [key, value] pair")
    return item[0], item[1]


def _str_of(body: Any) -> str:
    if not isinstance(body, str):
        raise TypeError("expected a string")
    return body


def _complex(body: Any) -> complex:
    if not isinstance(body, list) or len(body) != 2:
        raise ValueError("a complex is [real, imag]")
    return complex(float(_str_of(body[0])), float(_str_of(body[1])))


_SCALARS: dict[str, Any] = {
    "int": lambda b: int(_str_of(b)),
    "float": lambda b: float(_str_of(b)),
    "complex": _complex,
    "bytes": lambda b: bytes.fromhex(_str_of(b)),
}
_SEQUENCES: dict[str, Any] = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
