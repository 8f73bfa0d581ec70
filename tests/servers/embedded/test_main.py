"""``slime engine`` (server.main): the ready line, a live port, a clean exit on SIGTERM.

Runs ``main`` in-process on the main thread (signal handlers need it); a helper thread waits for
the ready line, probes the server, then sends SIGTERM to this process.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
import threading
import urllib.request


class _ReadyWatcher(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.ready = threading.Event()

    def write(self, s: str) -> int:
        n = super().write(s)
        if "\n" in self.getvalue():
            self.ready.set()
        return n


def test_main_prints_the_ready_line_serves_and_exits_cleanly_on_sigterm(tiny_model_path, monkeypatch):
    out = _ReadyWatcher()
    monkeypatch.setattr(sys, "stdout", out)
    seen: dict = {}
    main_returned = threading.Event()

    def drive() -> None:
        try:
            if not out.ready.wait(30) or main_returned.is_set():
                return
            match = re.fullmatch(r"SLIME_ENGINE_READY url=(http://127\.0\.0\.1:\d+)\n", out.getvalue())
            seen["line_ok"] = match is not None
            url = match.group(1)
            with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
                seen["health"] = resp.status
            with urllib.request.urlopen(f"{url}/model_info", timeout=10) as resp:
                seen["weight_version"] = json.load(resp)["weight_version"]
        finally:
            if not main_returned.is_set():  # never signal a process whose main already returned
                os.kill(os.getpid(), signal.SIGTERM)

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        code = main_entry(
            [
                "--model",
                str(tiny_model_path),
                "--port",
                "0",
                "--weight-version",
                "v0",
                "--threads",
                "1",
                "--log-level",
                "WARNING",
            ]
        )
    finally:
        main_returned.set()
        out.ready.set()
        driver.join(10)
    assert code == 0
    assert seen == {"line_ok": True, "health": 200, "weight_version": "v0"}


def main_entry(argv: list[str]) -> int:
    from slime.servers.embedded.server import main

    return main(argv)
