"""Stop the server listening on a TCP port, with its child processes (SGLang's scheduler, detokenizer).

    python3 scripts/gpu/stop_port.py PORT

By pid (psutil), never by a command-line pattern: a pattern can match the calling shell itself.
"""

import sys

import psutil

port = int(sys.argv[1])
pids = {
    c.pid
    for c in psutil.net_connections("tcp")
    if c.pid and c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
}
for pid in pids:
    proc = psutil.Process(pid)
    family = proc.children(recursive=True) + [proc]
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=20)
print(f"stopped {sorted(pids) or 'nothing'} on port {port}")
