"""Observability: what a run shows while it runs and leaves behind when it stops.

- ``observers.py``: ``Observers``, everything that watches one run, opened and closed together by
  the driver.
- ``trace.py``: a Chrome/Perfetto trace of requests, rewards, train steps, weight syncs and evals
  (``--enable-trace`` -> ``RUN_DIR/trace.json``).
- ``metrics.py``: Prometheus ``/metrics`` on the driver (``--metrics-port``) and the TensorBoard
  / W&B scalar writers (``--use-tensorboard``, ``--use-wandb``).
- ``progress.py``: the per-step progress bar (rich on a TTY) and summary lines.
- ``plots.py``: the end-of-run PNGs.
- ``report.py``: ``slime report RUN_DIR``, which reads a run directory, finished or crashed.
- ``strict_json.py``: the one JSON writer of run files (NaN and infinities as null).

Nothing here imports the loop: the driver hands these objects the values they show.
"""
