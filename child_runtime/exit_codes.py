"""Reserved exit codes and the one describer of exit statuses (children, grading workers).

A child that cannot boot says why with a reserved code and is never restarted.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping

OK = 0
BAD_CONFIG = 3
SCORER_IMPORT_FAILED = 4
SCORER_LOAD_FAILED = 6

MEANINGS = {
    BAD_CONFIG: "bad boot config",
    SCORER_IMPORT_FAILED: "scorer import failed",
    SCORER_LOAD_FAILED: "scorer load failed",
}


def describe(returncode: int | None, meanings: Mapping[int, str] = MEANINGS) -> str:
    """Human text for an exit status (negative: killed by that signal): 'exit 4 (scorer import failed)',
    'signal SIGKILL'. `meanings` names codes the caller reserves."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"signal {signal_name(-returncode)}"
    meaning = meanings.get(returncode)
    return f"exit {returncode}" + (f" ({meaning})" if meaning else "")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def is_boot_failure(returncode: int | None) -> bool:
    """Cannot boot, and would not on a retry: never restarted. A failed load (6) may be transient (OOM)."""
    return returncode in (BAD_CONFIG, SCORER_IMPORT_FAILED)
