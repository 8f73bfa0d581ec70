"""Bounds on what the judge (``code_judge``) computes from the program's values.

The values come from the program, and the judge runs on the event loop: everything whose cost could grow
with them is bounded here and raises ``ValueError`` past its limit (the case fails): repetition, ``%``
formatting of program strings, powers and shifts, ``range``, ``bytes(n)``, ``str.replace``, the
combinatorial ``math`` functions, arithmetic on huge ints (CPython's ``//``, ``%``, ``gcd`` are quadratic
in the digits), ``sum`` of sequences (quadratic in CPython), ``math.prod``, and sets or dicts whose
members share a hash (each insert probes past all earlier members of its hash).
"""

from __future__ import annotations

import ast
import math
from typing import Any, TypeAlias

__all__ = [
    "MAX_SIZE", "MAX_SAME_HASH", "Value", "bounded_bytes", "bounded_pow", "bounded_prod", "bounded_range", "bounded_sum",
    "check_call", "check_size", "refuse_hash_floods",
]  # fmt: skip

Value: TypeAlias = Any
"""A built-in value the program returned (``code_harness.decode_value``) or the check computes from one:
dynamically typed by nature (the evaluator applies Python's own operators to it), hence ``Any``."""

MAX_SIZE = 1 << 20
"""Largest sequence (items or characters) or ``range`` the evaluator builds from the program's values."""
_MAX_POW_BITS = 1 << 20
_MAX_INT_BITS = 1 << 17
"""Largest int (in bits, ~39k digits) that multiplies, divides or enters a call: CPython's ``//``, ``%``
and ``gcd`` are quadratic in the digits, and the channel can carry ints of millions of bits."""
_MAX_COMBINATORIAL_ARG = 100_000
_COMBINATORIAL = (math.factorial, math.comb, math.perm)
_LINEAR_IN_INTS = frozenset(
    {"isinstance", "type", "len", "bool", "abs", "max", "min", "sorted", "list", "tuple", "set"}
)
"""Calls whose cost stays linear in the digits of their int arguments (no bound on those)."""


def bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_SIZE:
        raise ValueError(f"a range of more than {MAX_SIZE} items")
    return r


def bounded_bytes(*args: Value) -> bytes:
    if args and isinstance(args[0], int) and args[0] > MAX_SIZE:
        raise ValueError(f"bytes of more than {MAX_SIZE}")
    return bytes(*args)


def _check_pow(base: Value, exp: Value) -> None:
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base).bit_length() * exp > _MAX_POW_BITS:
        raise ValueError(f"a power of more than {_MAX_POW_BITS} bits")


def bounded_pow(base: Value, exp: Value, mod: Value = None) -> Value:
    if mod is None:
        _check_pow(base, exp)
    elif (
        isinstance(exp, int) and isinstance(mod, int) and abs(mod).bit_length() * exp.bit_length() > _MAX_POW_BITS * 16
    ):
        raise ValueError("a modular power too costly to judge")  # one squaring mod ``mod`` per bit of ``exp``
    return pow(base, exp, mod)


def bounded_sum(items: Value, start: Value = 0) -> Value:
    """``sum`` where a sequence ``start`` concatenates in linear time (``sum(lists, [])`` copies its whole
    total once per item in CPython) and within ``MAX_SIZE``."""
    if not isinstance(start, list | tuple | str | bytes):
        return sum(items, start)
    if isinstance(start, str | bytes):
        raise TypeError("sum() can't sum strings [use ''.join(seq) instead]")
    out = list(start)
    for item in items:
        if type(item) is not type(start):
            raise TypeError(f"can only concatenate {type(start).__name__} to {type(start).__name__}")
        out.extend(item)
        if len(out) > MAX_SIZE:
            raise ValueError(f"a sum longer than {MAX_SIZE}")
    return type(start)(out)


def bounded_prod(items: Value, *, start: Value = 1) -> Value:
    """``math.prod`` with every partial product within ``_MAX_INT_BITS``."""
    out = start
    for item in items:
        _check_int(out)
        _check_int(item)
        out = out * item
    _check_int(out)
    return out


def _unflooded_input(kind: type, items: Value) -> list[Value]:
    """The input of ``set``/``frozenset``/``dict`` (``kind``) as a list, checked for a hash flood of its
    members (a dict's: its keys) before the collection is built; ValueError if it is one."""
    members = list(items.items() if kind is dict and isinstance(items, dict) else items)
    keys = members if kind is not dict else [m[0] for m in members if isinstance(m, tuple | list) and len(m) == 2]
    refuse_hash_floods(keys)
    return members


MAX_SAME_HASH = 64
"""Most members of one decoded set or dict that may share a hash: each insert probes past all earlier
members of its hash, so 100k crafted ints (``k * (2**61 - 1)``) would take the verifier minutes."""


def refuse_hash_floods(members: list[Value]) -> None:
    """Raise ValueError when more than ``MAX_SAME_HASH`` members share a hash (counted in linear time:
    hash values are small distinct ints, so counting them is itself collision-free)."""
    if len(members) <= MAX_SAME_HASH:
        return
    counts: dict[int, int] = {}
    for member in members:
        h = hash(member)  # TypeError for an unhashable member, as set() would raise
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > MAX_SAME_HASH:
            raise ValueError(f"more than {MAX_SAME_HASH} members of a set or dict share one hash")


def _check_int(value: Value) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_INT_BITS:
        raise ValueError(f"an int of more than {_MAX_INT_BITS} bits")


def check_size(op: ast.operator, left: Value, right: Value) -> None:
    """Raise ValueError where ``left op right`` would grow past the bounds (module docstring)."""
    if not isinstance(op, ast.Add | ast.Sub | ast.BitOr | ast.BitAnd | ast.BitXor | ast.RShift):  # linear in the digits
        _check_int(left)
        _check_int(right)
    if isinstance(op, ast.LShift) and isinstance(right, int) and right > _MAX_POW_BITS:
        raise ValueError(f"a shift by more than {_MAX_POW_BITS} bits")
    if isinstance(op, ast.Mult):
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, str | bytes | list | tuple) and isinstance(count, int) and len(seq) * count > MAX_SIZE:
                raise ValueError(f"a repetition longer than {MAX_SIZE}")
    if isinstance(op, ast.Mod) and isinstance(left, str | bytes):
        raise ValueError("%-formatting (its widths could be anything the program returned)")
    if isinstance(op, ast.Pow):
        _check_pow(left, right)


def check_call(fn: Value, args: list[Value]) -> list[Value]:
    """Raise ValueError where ``fn(*args)`` would grow past the bounds; returns the arguments to call it with
    (the input of ``set``/``frozenset``/``dict`` read into a list once, for the flood check)."""
    if fn in (set, frozenset, dict) and args:
        args = [_unflooded_input(fn, args[0]), *args[1:]]
    if getattr(fn, "__name__", "") not in _LINEAR_IN_INTS:
        for arg in args:
            _check_int(arg)
    if fn in _COMBINATORIAL and any(isinstance(a, int) and a > _MAX_COMBINATORIAL_ARG for a in args):
        raise ValueError(f"{fn.__name__} of more than {_MAX_COMBINATORIAL_ARG}")  # would stall the event loop
    if (
        getattr(fn, "__name__", "") == "replace"
        and isinstance(getattr(fn, "__self__", None), str | bytes)
        and len(args) >= 2
    ):
        if len(fn.__self__) * (len(args[1]) + 1) > MAX_SIZE:
            raise ValueError(f"a replace() that could grow past {MAX_SIZE}")
    return args
