"""The check of a generate function's return value (``--custom-generate-function-path`` or the default),
run by the scheduler after every call: a broken plugin stops the run with the reason instead of
looping on a sample that never finishes or crashing the trainer later."""

from __future__ import annotations

from slime.errors import PluginError
from slime.types import Sample

__all__ = ["check_generate_output", "function_name"]


def check_generate_output(
    sample: Sample, out: object, *, max_response_len: int, engine_version: int
) -> list[Sample] | None:
    """Validate a generate function's return value; a list replaces the sample in its group.

    Raises:
        PluginError: a wrong return type, misaligned lists, a sample left pending, over
            ``max_response_len`` or with a token newer than ``engine_version``
            (``Sample.generate_contract_problems``).
    """
    where = f"group {sample.group_id} sample {sample.index}"
    if out is sample or out is None:
        sample.check_aligned()
        _raise_first(
            sample.generate_contract_problems(max_response_len=max_response_len, engine_version=engine_version)
        )
        return None
    if isinstance(out, Sample):
        raise PluginError(
            f"generate function returned a different Sample object for {where}; grow and return the one given"
        )
    if not isinstance(out, list) or not out or not all(isinstance(s, Sample) for s in out):
        raise PluginError(
            f"generate function returned {type(out).__name__} for {where}; expected the Sample or a non-empty list of Samples"
        )
    for s in out:
        s.check_aligned()
        if not s.status.is_finished:
            raise PluginError(
                f"generate function returned several samples for {where}, one with status {s.status.value}; each must be finished"
            )
        s.group_id = sample.group_id
        _raise_first(s.generate_contract_problems(max_response_len=max_response_len, engine_version=engine_version))
    return out


def function_name(fn: object) -> str:
    """``module.qualname`` of a function, a ``functools.partial`` of one, or a callable instance's class."""
    fn = getattr(fn, "func", fn)
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{target.__module__}.{target.__qualname__}"


def _raise_first(problems: list[str]) -> None:
    if problems:
        raise PluginError(f"generate function broke its contract: {problems[0]}")
