"""``fenced_blocks``: the code fences of a response, found in linear time (a quadratic regex froze the event loop)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.rollout.verifiers.code import extract_code, fenced_blocks

# the pattern fenced_blocks replaced: the reference for what a block is
REFERENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="`\npy3 x+_", max_size=60))
def test_the_blocks_are_the_reference_patterns_matches(text):
    assert fenced_blocks(text) == REFERENCE.findall(text)


def test_the_last_python_block_is_the_code():
    response = "plan\n```text\nnot code\n```\n```python extra\nprint(1)\n```\n```\nlast plain\n```"
    assert extract_code(response) == "print(1)\n"
    assert extract_code("no fence") is None


def test_a_long_line_after_a_fence_is_one_pass():
    # 300k characters without a newline after the fence: the reference backtracks over every split of the line
    # (about a minute); one pass of str.find is milliseconds, so this test cannot hang the suite
    assert fenced_blocks("```" + "a" * 300_000) == []
    assert fenced_blocks("`" * 300_000) == []
