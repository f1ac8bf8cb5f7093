"""What every owner of worker processes shares: the exit-status describer and the parent-death
signal.

In the lowest floor of the project, `scorers.common` (stdlib only): the grading pool's workers, the
scorer child and the trainer side all describe an exit the same way, and arm the same kernel hook.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Mapping

PR_SET_PDEATHSIG = 1


def describe(returncode: int | None, meanings: Mapping[int, str] | None = None) -> str:
    """Human text for an exit status (negative: killed by that signal): 'exit 4 (scorer import
    failed)', 'signal SIGKILL'. `meanings` names codes the caller reserves."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"signal {signal_name(-returncode)}"
    meaning = (meanings or {}).get(returncode)
    return f"exit {returncode}" + (f" ({meaning})" if meaning else "")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def set_parent_death_signal(signum: int) -> None:
    """Ask the kernel to send `signum` when the parent (its spawning thread) exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
