"""Tools for multi-turn rollouts: the registry, tool-call parsing, and the built-in tools.

::

    registry.py    Tool, ToolResult, ToolRegistry (timeouts and failures become tool messages)
    parse.py       parse_tool_calls: Hermes / Qwen ``<tool_call>{json}</tool_call>`` blocks
    calculator.py  calculator_tool: arithmetic over an ``ast`` walk, size-guarded
    sandbox.py     Sandbox (model-written Python in bubblewrap, with limits) and python_tool
    bwrap.py       BwrapLauncher: the bubblewrap command line, probed once per process
    retrieval.py   BM25Index over a JSONL corpus and retrieval_tool
"""
