"""The engine's keeper: a stdlib-only process between a scorer child and the engine it serves.

Why a process of its own: an engine (vLLM, `transformers serve`) must never outlive the scorer that
owns it, however that scorer ends. The scorer child's process group is killed by its parent at
close and after a crash, so the keeper starts a session of its own (out of that group's reach) and
watches a pipe whose write end only the scorer holds: end of file means the scorer is gone (exited,
killed -9, or asked the keeper to stop by closing it), and the keeper then ends the engine's whole
group, SIGTERM first and SIGKILL after a grace. The engine itself is armed with PR_SET_PDEATHSIG, so
it dies even with a keeper that was killed -9. The keeper exits with the engine's status when the
engine exits first (a crash the scorer reports with the log's tail).

Run as a script, by path, with the engine env's Python:
`python keeper.py ALIVE_FD GRACE_S COMMAND...`; it imports nothing of this project.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
STOP_EXIT = 0  # the scorer closed the pipe and the engine was stopped: a clean end


def _die_with_parent() -> None:
    """In the engine, before exec: SIGKILL when the keeper (its only parent) is gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _end_group(engine: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the engine's group (the keeper's own session: the engine's workers too), SIGKILL
    whatever is left after `grace_s`, and reap the engine."""
    group = os.getpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the keeper outlives its own SIGTERM to finish
    os.killpg(group, signal.SIGTERM)
    try:
        engine.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        engine.wait(timeout=0.5)
    except subprocess.TimeoutExpired:
        pass
    # the keeper dies with this too (it is in the group): nothing of the engine stays behind
    os.killpg(group, signal.SIGKILL)


def main(argv: list[str]) -> int:
    alive_fd, grace_s, command = int(argv[0]), float(argv[1]), argv[2:]
    os.set_blocking(alive_fd, False)
    engine = subprocess.Popen(command, preexec_fn=_die_with_parent, close_fds=True)
    watch = selectors.DefaultSelector()
    watch.register(alive_fd, selectors.EVENT_READ)
    # SIGTERM to the keeper (a person, or a supervisor) stops the engine the same way
    signal.signal(signal.SIGTERM, lambda signum, frame: _end_group(engine, grace_s))
    while True:
        status = engine.poll()
        if status is not None:
            return status if status >= 0 else 128 - status
        if watch.select(timeout=0.2):
            try:
                data = os.read(alive_fd, 4096)
            except BlockingIOError:
                continue
            if not data:
                _end_group(engine, grace_s)
                time.sleep(0.1)  # not reached: the group's SIGKILL took the keeper too
                return STOP_EXIT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
