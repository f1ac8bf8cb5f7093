"""grade_fn targets for GradingPool tests; they run inside real worker processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def square(x: int) -> int:
    return x * x


def echo(*args: object) -> tuple:
    return args


def sleep_for(seconds: float, value: object = None) -> object:
    """Sleep (interruptible only by a signal), then return `value`."""
    time.sleep(seconds)
    return value


def touch_then_sleep(path: str, seconds: float) -> None:
    """Mark the task as started (so a test can wait on a file, not a clock), then sleep."""
    Path(path).write_text(str(os.getpid()))
    time.sleep(seconds)


def crash_hard(code: int = 7) -> None:
    """Exit without cleanup, as a segfaulting extension would."""
    os._exit(code)


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_if(value: object, code: int = 7) -> object:
    """Echo `value`, but exit hard when it is "crash"."""
    if value == "crash":
        os._exit(code)
    return value


def raise_value_error(message: str) -> None:
    raise ValueError(message)


def busy_loop_in_c() -> int:
    """A huge big-int power: minutes inside one C call, deaf to Python signal handlers."""
    base, exponent = 10, 10**8
    return (base**exponent) & 1


def unpicklable_result() -> object:
    return lambda: None


def preload_state(*modules: str) -> dict:
    """Which of `modules` this worker has loaded, and how many objects it has frozen: what it was
    forked from."""
    import gc
    import sys

    return {"loaded": [name in sys.modules for name in modules], "frozen": gc.get_freeze_count()}


def frozen_objects() -> int:
    """How many objects this worker's collector never walks (frozen in the forkserver)."""
    import gc

    return gc.get_freeze_count()


def fail_if(value: object) -> object:
    """Echo `value`, but raise ValueError when it is "bad" (a worker that stays healthy)."""
    if value == "bad":
        raise ValueError(f"refusing {value!r}")
    return value


# --------------------------------------------------------------------------- test-side helpers
# (psutil is imported lazily: this module is also imported by the workers.)

_HELPER_MARKERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def multiprocessing_helpers(process=None) -> list:
    """The forkserver / resource_tracker children of `process` (default: this one)."""
    import psutil

    process = process or psutil.Process()
    helpers = []
    for child in process.children():
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if any(marker in command for marker in _HELPER_MARKERS):
            helpers.append(child)
    return helpers


def is_gone(pid: int) -> bool:
    """True when the pid no longer runs (a zombie counts as gone: it runs nothing)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids, timeout_s: float) -> list[int]:
    """Poll until every pid is gone or the deadline passes; return the survivors."""
    deadline = time.monotonic() + timeout_s
    survivors = [pid for pid in pids if not is_gone(pid)]
    while survivors and time.monotonic() < deadline:
        time.sleep(0.05)
        survivors = [pid for pid in survivors if not is_gone(pid)]
    return survivors


def spin(cpu_seconds: float, value: object = None) -> object:
    """Burn CPU until this process has used `cpu_seconds` more: progress only while it runs."""
    until = time.process_time() + cpu_seconds
    while time.process_time() < until:
        pass
    return value


def allocate(mib: int) -> int:
    """One allocation of `mib` MiB at once (a memory bomb)."""
    return len(bytearray(mib * 2**20))


_LEAKED: list[bytearray] = []


def allocate_caught(mib: int, step_mib: int = 8) -> float:
    """Grow in steps until `mib` MiB, catching the MemoryError as math_verify does (its verdict:
    0)."""
    held = []
    try:
        for _ in range(mib // step_mib):
            held.append(bytearray(step_mib * 2**20))
    except MemoryError:
        return 0.0
    return 1.0


def leak(mib: int) -> int:
    """Keep `mib` MiB for the rest of the worker's life (a grader whose caches grow)."""
    _LEAKED.append(bytearray(mib * 2**20))
    for page in range(0, len(_LEAKED[-1]), 4096):  # touch every page: resident, not just mapped
        _LEAKED[-1][page] = 1
    return mib


def cpu_limit_signal() -> None:
    """As the kernel does when a task passes RLIMIT_CPU."""
    os.kill(os.getpid(), signal.SIGXCPU)
    time.sleep(5)


_SEEN: set = set()


def remember(value: object) -> bool:
    """Whether this process, or the one it was forked from, graded `value` before (a grader's
    cache)."""
    seen = value in _SEEN
    _SEEN.add(value)
    return seen


def spin_then_sleep(cpu_seconds: float, sleep_seconds: float, value: object = None) -> object:
    """Burn `cpu_seconds` of CPU, then sleep `sleep_seconds`: work that computes and work that
    waits."""
    spin(cpu_seconds)
    time.sleep(sleep_seconds)
    return value


def fast_once(path: str) -> str:
    """Fast the first time any process grades `path`, 3 s of CPU every time after (a replay that is
    slow)."""
    try:
        Path(path).touch(exist_ok=False)
    except FileExistsError:
        spin(3.0)
    return path


def echo_or_raise(value: object) -> object:
    """Echo `value`, but raise ValueError when it is "raise"."""
    if value == "raise":
        raise ValueError("asked to raise")
    return value


def hold_memory(mib: int, seconds: float) -> int:
    """Touch `mib` MiB of private memory, then wait `seconds` holding it."""
    held = bytearray(mib * 2**20)
    time.sleep(seconds)
    return len(held)
