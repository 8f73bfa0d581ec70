"""The Hermes / Qwen tool-call markup: the tags around one call's JSON in a model turn.

Written by the calculator task's demonstrations (``slime.data.calc``) and read by the tool-call
parser (``slime.rollout.tools.parse``), so both sides agree on one spelling::

    <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>
"""

__all__ = ["TOOL_CALL_OPEN", "TOOL_CALL_CLOSE"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
