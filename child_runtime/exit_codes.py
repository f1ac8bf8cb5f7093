"""Reserved exit codes: a child that cannot boot says why, and is never restarted."""
import signal

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
    """Human text for a Popen returncode: 'exit 4 (scorer import or load failed)' or 'signal SIGKILL'."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"signal {signal_name(-returncode)}"
    meaning = MEANINGS.get(returncode)
    return f"exit {returncode}" + (f" ({meaning})" if meaning else "")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def is_boot_failure(returncode: int | None) -> bool:
    """Cannot boot, and would not on a retry: never restarted. A failed load (6) may be transient (OOM)."""
    return returncode in (BAD_CONFIG, SCORER_IMPORT_FAILED)


__all__ = ["OK", "BAD_CONFIG", "SCORER_IMPORT_FAILED", "SCORER_LOAD_FAILED", "describe", "signal_name"]
