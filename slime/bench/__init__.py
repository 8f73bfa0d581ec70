"""Benchmarks (``slime bench ...``): measured side by side, on the same inputs, with the command,
machine and date recorded in ``docs/benchmarks.md``.

- ``rollout.py``: ``slime bench rollout``, sync vs APRIL vs fully async on the long-tail workload of
  the simulated engine or a real SGLang, plus the scheduler's and the HTTP client's own overhead.
- ``workload.py``: the standard long-tail workload and each mode's knobs.
- ``modes.py``: one mode's run (fresh engine process, scheduler, ``run_step`` x steps) and its metrics.
- ``overhead.py``: scheduler completions/s on an instant in-process engine; ``HttpEnginePool`` vs a bare
  aiohttp client against an instant engine on loopback.
- ``lengths.py``: each sample's response length, drawn by the client and enforced per request.
- ``occupancy.py``: engine occupancy measured from the client side (any engine).
- ``calibrate.py``: a real engine's decode cost (a + b x running) and the sim engine calibrated to it.
- ``engine_proc.py``: a simulated engine in its own process (so client CPU is measured alone).
- ``rollout_table.py``: the table, the target check and the PNG of ``slime bench rollout``.
- ``run_meta.py``: what a bench run records about where and when it ran (date, machine, commit, load).
- ``learning.py``: ``slime bench learning``, held-out accuracy against wall time and trained tokens
  for sync, APRIL and async (and their off-policy corrections) over seeds, through the real driver.
- ``learning_modes.py``: its runs: each mode's own ``slime train`` flags, the bench's defaults and one
  run's arguments.
- ``learning_curves.py``: its arithmetic: accuracy curves from ``metrics.jsonl``, the summary over
  seeds, the table and the plot (pure functions, no run).
- ``trainer.py``: RL train steps of one backend against another on the same groups, in one process
  (``scripts/gpu/bench_trainer.py``, ``scripts/bench_megatron_mfu.py``).
- ``candidates.py``: kernel candidates for the megatron backend, swapped in for one backend of that bench
  (``--backends megatron,megatron+NAME``) so the default and the candidate are measured in one process.
"""
