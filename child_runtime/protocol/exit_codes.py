"""Reserved exit codes of a scorer child (the describer itself is
`scorers.common.processes.describe`).

A child that cannot boot says why with a reserved code and is never restarted.
"""

from __future__ import annotations

from scorers.common import processes

OK = 0
BAD_CONFIG = 3
SCORER_IMPORT_FAILED = 4
SCORER_LOAD_FAILED = 6

MEANINGS = {
    BAD_CONFIG: "bad boot config",
    SCORER_IMPORT_FAILED: "scorer import failed",
    SCORER_LOAD_FAILED: "scorer load failed",
}


def describe(returncode: int | None) -> str:
    """A scorer child's exit status, its reserved codes named."""
    return processes.describe(returncode, MEANINGS)


def is_boot_failure(returncode: int | None) -> bool:
    """Cannot boot, and would not on a retry: never restarted. A failed load (6) may be transient
    (OOM)."""
    return returncode in (BAD_CONFIG, SCORER_IMPORT_FAILED)
