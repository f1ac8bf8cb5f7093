"""`managed-scorers serve` processes for the bench lines: their readiness line, and their stop."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


def readiness(ready: Path, server: subprocess.Popen[Any], deadline_s: float = 120.0) -> dict[str, Any]:
    """The first line `serve` wrote to `ready` (its stdout). A server that exits first, or writes
    nothing by the deadline, raises; stopping it is the caller's (`stop`, in its finally)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        text = ready.read_text()
        if text.endswith("\n"):
            return dict(json.loads(text.splitlines()[0]))
        if server.poll() is not None:
            raise RuntimeError(f"serve (pid {server.pid}) exited with {server.returncode} before it was ready")
        time.sleep(0.02)
    raise TimeoutError(f"no readiness line in {ready} from serve (pid {server.pid}) after {deadline_s} s")


def stop(*servers: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """SIGTERM to each (SIGCONT first: a stopped server cannot act on it), then SIGKILL past `grace_s`."""
    for server in servers:
        if server.poll() is None:
            server.send_signal(signal.SIGCONT)
            server.send_signal(signal.SIGTERM)
    for server in servers:
        try:
            server.wait(grace_s)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
