"""The engine's keeper: a stdlib-only process between a scorer child and the engine it serves.

Why a process of its own: an engine (vLLM, `transformers serve`) must never outlive the scorer that
owns it, however that scorer ends. The scorer child's process group is killed by its parent at
close and after a crash, so the keeper starts a session of its own (out of that group's reach) and
watches a pipe whose write end only the scorer holds: end of file means the scorer is gone (exited,
killed -9, or asked the keeper to stop by closing it), and the keeper then ends the engine's whole
group, SIGTERM first and SIGKILL after a grace, and exits 0. The engine itself is armed with
PR_SET_PDEATHSIG, so it dies even with a keeper that was killed -9 (and the scorer then kills what
is left of the group). When the engine exits first, the keeper kills the rest of its group (an
engine's workers) and exits with the engine's status (128 + N for signal N): a crash the scorer
reports with the log's tail.

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
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
STOP_EXIT = 0  # the scorer closed the pipe and the engine was stopped: a clean end


def _die_with(keeper: int) -> Callable[[], None]:
    """In the engine, before exec: SIGKILL when the keeper (its only parent) is gone, and exit at
    once if it already was (the signal would never come)."""

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != keeper:
            os._exit(1)

    return arm


def _kill_the_rest() -> None:
    """SIGKILL every other process of the keeper's group (an engine's workers outliving it)."""
    group, me = os.getpgrp(), os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
            if int(fields[2]) == group:  # after the name: state, ppid, pgrp
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue  # ended while read


def _end_group(engine: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the engine's group (the keeper's own session: the engine's workers too), wait up
    to `grace_s` for the engine, then SIGKILL whatever is left, and reap the engine."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the keeper outlives its own SIGTERM to finish
    os.killpg(os.getpgrp(), signal.SIGTERM)
    try:
        engine.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _kill_the_rest()
    engine.wait()  # SIGKILLed: it goes at once


def main(argv: list[str]) -> int:
    alive_fd, grace_s, command = int(argv[0]), float(argv[1]), argv[2:]
    os.set_blocking(alive_fd, False)
    engine = subprocess.Popen(command, preexec_fn=_die_with(os.getpid()), close_fds=True)
    watch = selectors.DefaultSelector()
    watch.register(alive_fd, selectors.EVENT_READ)
    stopping = []  # SIGTERM to the keeper (a person, a supervisor) stops the engine the same way
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    while True:
        status = engine.poll()
        if status is not None:  # the engine ended first: none of its workers may stay
            _kill_the_rest()
            return status if status >= 0 else 128 - status
        closed = False
        if watch.select(timeout=0.2):
            try:
                closed = not os.read(alive_fd, 4096)
            except BlockingIOError:
                pass
        if closed or stopping:
            _end_group(engine, grace_s)
            return STOP_EXIT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
