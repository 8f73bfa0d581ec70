"""The program the code verifier runs in the sandbox for assert tests, and how its answers are read.

The sandbox runs ``harness_program(solution)``: a harness with the solution's source embedded as a
string. On stdin it gets ``harness_request(setup, probes)``, the case's setup imports and the probe
expressions (``code_asserts``: the solution's calls, never the expected values). It then

1. reads stdin whole, points the program's stdin at ``/dev/null`` and its stdout at stderr, keeping the
   original stdout as the result channel, so nothing the program prints lands on the channel;
2. runs the solution, then the setup, in one namespace (``__name__ == "__main__"``, as a script);
3. evaluates each probe there and writes one JSON line per probe to the channel: its value as built-in
   types only (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``, ``tuple``,
   ``set``, ``frozenset``, ``dict``; a subclass such as ``Counter`` or a namedtuple as its base type's
   content, read with the base type's own methods, so no ``__eq__`` or ``__iter__`` of the program's
   reaches the judge; anything else, e.g. a ``map``, is refused), or the exception it raised (any
   ``BaseException``: ``SystemExit`` too);
4. writes ``{"done": n}`` and ends with ``os._exit(0)`` (no ``atexit`` hook or thread of the solution runs).

The solution shares the harness's process, so it can write to the channel or rewrite the harness: what
makes that useless is that the expected values never enter the sandbox. ``read_channel`` accepts only
the exact frame sequence above (loaded, one frame per probe in order, done, nothing after, exit status
0); anything else, an early exit included, fails the sample. Values are rebuilt in our process as plain
built-ins (``decode_value``) and judged there (``code_judge``).

Both programs (``harness_program`` and ``script_program``, for stdin/stdout tests) give the solution
``exit()`` and ``quit()``, which ``python -S`` lacks and contest solutions use.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from slime.rollout.verifiers.code_bounds import Value, refuse_hash_floods

__all__ = ["ChannelReport", "decode_value", "harness_program", "harness_request", "read_channel", "script_program"]

_MAX_DEPTH = 64
"""Deepest nesting of a returned value that is encoded (and decoded)."""

_PRELUDE = r"""
import builtins as _builtins, json as _json, os as _os, sys as _sys

_builtins.exit = _builtins.quit = _sys.exit  # python -S has no site.py, so no exit()/quit(); scripts use them
"""

_HARNESS = r"""
# Plain values by exact type; subclasses (Counter, OrderedDict, namedtuple, IntEnum) as their base type's
# content, read with the base type's own methods, so nothing of the program's class reaches the judge.
_BASES = (
    (dict, lambda v: {"dict": [[_encode(k), _encode(x)] for k, x in dict.items(v)]}),
    (tuple, lambda v: {"tuple": [_encode(x) for x in tuple.__iter__(v)]}),
    (list, lambda v: [_encode(x) for x in list.__iter__(v)]),
    (frozenset, lambda v: {"frozenset": [_encode(x) for x in frozenset.__iter__(v)]}),
    (set, lambda v: {"set": [_encode(x) for x in set.__iter__(v)]}),
    (bytes, lambda v: {"bytes": bytes.hex(v)}),
    (str, lambda v: str.__str__(v)),
    (int, lambda v: _int(int.__int__(v))),
    (float, lambda v: float.__float__(v)),
    (complex, lambda v: {"complex": [complex.real.__get__(v), complex.imag.__get__(v)]}),
)
_depth = [0]


def _int(value):
    return {"hexint": hex(value)} if value.bit_length() > 13000 else value  # past str()'s 4300-digit limit


def _encode(value):
    if value is None or value is True or value is False:
        return value
    _depth[0] += 1
    try:
        if _depth[0] > MAX_DEPTH:
            raise ValueError("a value nested deeper than %d" % MAX_DEPTH)
        for base, encode in _BASES:
            if isinstance(value, base):
                return encode(value)
    finally:
        _depth[0] -= 1
    raise TypeError("returned a %s (only built-in values are compared)" % type(value).__name__)


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

    namespace = {"__name__": "__main__", "__file__": __file__, "__builtins__": _builtins}
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
            _depth[0] = 0
            send({"probe": k, "value": _encode(value)})
        except BaseException as exc:
            send({"probe": k, "unencodable": _describe(exc)})
    finish(len(request["probes"]))


_harness(SOLUTION)
"""

_SCRIPT = r"""
exec(compile(SOLUTION, "solution.py", "exec"), {"__name__": "__main__", "__file__": __file__, "__builtins__": _builtins})
"""


def script_program(solution: str) -> str:
    """The sandbox program for stdin/stdout tests: ``solution`` run as a script, with ``exit()``/``quit()``."""
    return _PRELUDE + _SCRIPT.replace("SOLUTION", repr(solution))


def harness_program(solution: str) -> str:
    """The sandbox program for assert tests: the harness with ``solution`` (Python source) embedded."""
    return _PRELUDE + _HARNESS.replace("MAX_DEPTH", str(_MAX_DEPTH)).replace("SOLUTION", repr(solution))


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
    """Parse the harness's channel (the sandbox's stdout) for ``num_probes`` probes (module docstring).

    Never raises: whatever the program wrote there, the answer is a report (a bad channel is a problem).
    """
    try:
        return _read_frames([json.loads(line) for line in channel.splitlines() if line], num_probes)
    except (ValueError, TypeError, KeyError, RecursionError, OverflowError):  # JSON, a 4300-digit int, bad shapes
        return ChannelReport(_FORGED)


_FORGED = "the result channel holds lines the verifier did not write"


def _read_frames(frames: list[object], num_probes: int) -> ChannelReport:
    if not frames or not isinstance(frames[0], dict):
        return ChannelReport("the program ended before the harness reported (an early exit or a crash)")
    if "load_error" in frames[0]:
        return ChannelReport(f"the program raised {_text(frames[0]['load_error'])} before any test ran")
    if frames[0] != {"loaded": True}:
        return ChannelReport(_FORGED)
    body, rest = frames[1 : 1 + num_probes], frames[1 + num_probes :]
    if len(body) < num_probes or rest[:1] != [{"done": num_probes}]:
        ended = "the program ended before the verifier's last test (an early exit, a crash, or killed)"
        return ChannelReport(ended if len(frames) < num_probes + 2 else _FORGED)
    if len(rest) > 1:
        return ChannelReport("the result channel holds lines after the harness finished")
    return ChannelReport(None, tuple(_outcome(frame, k) for k, frame in enumerate(body)))


def _outcome(frame: object, k: int) -> tuple[bool, Value]:
    if not isinstance(frame, dict) or frame.get("probe") != k or len(frame) != 2:
        raise ValueError("not the harness's frame")
    if "raised" in frame:
        return False, f"raised {_text(frame['raised'])}"
    if "unencodable" in frame:
        return False, _text(frame["unencodable"]).removeprefix("TypeError: ")
    return True, decode_value(frame["value"])


def _text(value: object) -> str:
    """Program-written text for evidence: bounded, and valid UTF-8 (a lone surrogate would break the records)."""
    return str(value)[:400].encode("utf-8", "backslashreplace").decode("utf-8")


def decode_value(obj: object, depth: int = 0) -> Value:
    """A built-in value from the harness's encoding (module docstring): ``None``, ``bool``, ``int``,
    ``float`` and ``str`` as JSON, ``list`` as a JSON array, the rest as ``{"tag": body}``.

    Raises:
        ValueError / TypeError: anything the harness would not have written (a bad tag, an unhashable set
            member, nesting past the limit).
    """
    if depth > _MAX_DEPTH:
        raise ValueError("nested too deep")
    if obj is None or isinstance(obj, bool | str | int | float):
        return obj
    if isinstance(obj, list):
        return [decode_value(v, depth + 1) for v in obj]
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError(f"not an encoded value: {obj!r:.80}")
    ((tag, body),) = obj.items()
    if tag in _SCALARS:
        return _SCALARS[tag](body)
    if tag == "dict" and isinstance(body, list):
        pairs = [(decode_value(k, depth + 1), decode_value(v, depth + 1)) for k, v in (_pair(p) for p in body)]
        refuse_hash_floods([k for k, _ in pairs])
        return dict(pairs)
    if tag in _SEQUENCES and isinstance(body, list):
        items = [decode_value(v, depth + 1) for v in body]
        if tag != "tuple":
            refuse_hash_floods(items)
        return _SEQUENCES[tag](items)
    raise ValueError(f"unknown tag {tag!r:.40}")


def _pair(item: object) -> tuple[object, object]:
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError("a dict item is not a [key, value] pair")
    return item[0], item[1]


def _of(kind: type, body: object) -> Value:
    if type(body) is not kind:
        raise TypeError(f"expected a {kind.__name__}")
    return body


def _complex(body: object) -> complex:
    if not isinstance(body, list) or len(body) != 2:
        raise ValueError("a complex is [real, imag]")
    return complex(_of(float, body[0]), _of(float, body[1]))


_SCALARS: dict[str, Any] = {
    "hexint": lambda b: int(_of(str, b), 16),
    "complex": _complex,
    "bytes": lambda b: bytes.fromhex(_of(str, b)),
}
_SEQUENCES: dict[str, Any] = {"tuple": tuple, "set": set, "frozenset": frozenset}
