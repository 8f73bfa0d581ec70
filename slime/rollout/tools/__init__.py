"""Tools for multi-turn rollouts: the registry, tool-call parsing, and the built-in tools.

::

    registry.py    Tool, ToolResult, ToolRegistry (timeouts and failures become tool messages)
    parse.py       parse_tool_calls: Hermes / Qwen ``<tool_call>{json}</tool_call>`` blocks
    calculator.py  calculator_tool: arithmetic over an ``ast`` walk, size-guarded
    sandbox.py     Sandbox (model-written Python in bubblewrap, with limits) and python_tool
    bwrap.py       BwrapLauncher: the bubblewrap command line (never the host's root), probed once per process
    seccomp.py     the sandbox's seccomp filter (libseccomp through ctypes), as BPF for bwrap
    cgroup.py      a cgroup per sandbox run: pids and memory for the whole tree, the tree killed at the end
    isolation.py   what this machine gives the sandbox, and what it lacks (one line each)
    audit_hook.py  the unsafe mode's in-process audit hook (no OS sandbox)
    retrieval.py   BM25Index over a JSONL corpus and retrieval_tool
"""
