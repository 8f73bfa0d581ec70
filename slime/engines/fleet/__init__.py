"""Engine processes: the launch plan (``plan.py``) from the server groups (``groups.py``) and the
placement flags (``placement.py``), starting and stopping one process (``processes.py``), bringing a
run's engines up and down (``start.py``), and restarting dead ones (``supervisor.py``)."""
