"""A run's processes placed and supervised on a Ray cluster (issue 28; docs/ray.md).

- ``plan.py``: what to start (``RunShape``, from THUDM/slime's placement flags) laid onto GPU slots in
  slime's order, as a ``PlacementTable``; ``plan_placement`` does it for a cluster shape given as
  numbers (``--dry-run``: no cluster, no Ray import);
- ``placement.py``: the same table from one real Ray placement group (bundles probed and sorted by node and GPU);
- ``actors.py``: ``ProcessActor``, one of our processes (an engine server, a trainer rank) on its bundle's node;
- ``supervise.py``: ``ClusterRun``, every process of a table started, watched (engines restarted, a dead
  trainer rank one line) and released at exit, SIGTERM and Ctrl-C included;
- ``connect.py``: ``connect``, the ``--ray-address`` semantics.

Ray places and supervises processes; it carries no tokens (the data plane stays HTTP to the engines).
Only ``plan.py`` is imported without Ray installed (the ``slime[ray]`` extra).
"""
