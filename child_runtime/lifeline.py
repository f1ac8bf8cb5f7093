"""The child dies with its parent, and takes its process group with it.

Two layers: PR_SET_PDEATHSIG delivers a signal when the spawning *thread* of
the parent exits, so its handler confirms with getppid() before acting; a
watchdog thread polls getppid() for the case where the main thread is stuck
in C code and cannot run Python signal handlers.
"""

from __future__ import annotations

import os
import signal
import threading

from scorers.common.processes import set_parent_death_signal

LIFELINE_SIGNAL = signal.SIGUSR2
POLL_INTERVAL_S = 0.2


def _kill_own_group() -> None:
    # We are a session and group leader: this takes forkservers and workers too.
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _check(expected_ppid: int) -> None:
    if os.getppid() != expected_ppid:
        _kill_own_group()


def _watchdog(expected_ppid: int) -> None:
    stop = threading.Event()
    while not stop.wait(POLL_INTERVAL_S):
        _check(expected_ppid)


def install(expected_ppid: int) -> None:
    """Arm both layers; call first thing in the child, before any slow import."""
    signal.signal(LIFELINE_SIGNAL, lambda signum, frame: _check(expected_ppid))
    set_parent_death_signal(LIFELINE_SIGNAL)
    _check(expected_ppid)  # the parent may have died before prctl
    threading.Thread(target=_watchdog, args=(expected_ppid,), name="lifeline", daemon=True).start()
