"""Code that runs inside a grading worker (forked from the forkserver).

A worker arms PR_SET_PDEATHSIG so it dies with the forkserver even when stuck
in C code, drops its copy of the forkserver's "alive" pipe, caps its address
space (RLIMIT_AS), announces readiness, then grades one task at a time, each
under a CPU-time limit (RLIMIT_CPU), until its pipe closes.
"""

from __future__ import annotations

import gc
import importlib
import math
import os
import resource
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from scorers.common.processes import set_parent_death_signal
from scorers.grading.messages import Fatal, Graded, OverMemory, Raised, Ready, Task, WorkerReply

ORPHANED_EXIT_CODE = 70
_ERROR_HEAD_CHARS = 1000
_ERROR_TRACEBACK_CHARS = 2000


def _drop_forkserver_alive_fd() -> None:
    """Close our copy of the forkserver's "alive" pipe.

    The forkserver exits only when every holder of that pipe's write end is
    gone; a worker stuck grading would otherwise keep it (and so itself) alive
    after the owner dies. Workers never start processes, so they don't need it.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if server is None or fd is None:
        return
    try:
        os.close(fd)
    except OSError:
        pass
    server._forkserver_alive_fd = None


def _resolve(path: str) -> Callable[..., Any]:
    """Import "module:function"; raise with the path named so a typo is obvious."""
    module_name, _, attr = path.partition(":")
    fn = getattr(importlib.import_module(module_name), attr, None)
    if not callable(fn):
        raise AttributeError(f"{path!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def _format_exception(exc: BaseException) -> str:
    """The "TypeName: message" line plus the innermost frames, bounded so the pipe stays small."""
    head = f"{type(exc).__name__}: {exc}"[:_ERROR_HEAD_CHARS]
    frames = "".join(traceback.format_tb(exc.__traceback__, limit=-4))
    return f"{head}\n{frames[-_ERROR_TRACEBACK_CHARS:]}".rstrip()


def _address_space() -> int:
    """This process's mapped address space in bytes (VmSize), what RLIMIT_AS limits."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _peak_address_space() -> int:
    """The most address space this process has mapped (VmPeak), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024
    return 0


def _cap_memory(memory_cap_bytes: int | None) -> int | None:
    """Let one task map at most `memory_cap_bytes` beyond what the worker maps now: past it, an
    allocation fails with MemoryError (the task is scored as over the cap) instead of growing the
    worker until the machine's OOM killer picks a victim."""
    if memory_cap_bytes is None:
        return None
    limit = _address_space() + memory_cap_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


def cap_cpu(cpu_limit_s: float | None) -> None:
    """The kernel's backstop to the owner's wall-clock timeout: SIGXCPU once this task has used
    `cpu_limit_s` CPU seconds (the soft limit only: an unprivileged process cannot raise a hard
    one)."""
    if cpu_limit_s is None:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(used + cpu_limit_s)
    resource.setrlimit(
        resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard)
    )


def enter_worker(expected_ppid: int) -> None:
    """What every grading process does first: die with its parent (armed, then checked: the parent
    may have died before prctl took effect), leave ^C to the owner, drop the forkserver's pipe."""
    set_parent_death_signal(signal.SIGKILL)
    if expected_ppid and os.getppid() != expected_ppid:
        os._exit(ORPHANED_EXIT_CODE)  # the signal will never come
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the owner's to handle; it kills us
    _drop_forkserver_alive_fd()
    # paused for the forkserver's preload (forkserver_enter); resumed there too, unless it failed
    gc.enable()


def import_preload(modules: Sequence[str]) -> None:
    """Import the pool's preload modules this process lacks, the collector paused, then freeze what
    they built: a template forked from a forkserver the pool did not launch (the caller's own,
    preloading other modules) then forks workers as warm as the pool's forkserver would. A no-op
    where the forkserver preloaded them."""
    missing = [name for name in modules if name not in sys.modules]
    if not missing:
        return
    gc.disable()
    try:
        for name in missing:
            importlib.import_module(name)
    finally:
        gc.freeze()
        gc.enable()


def load_grader(
    conn: Any, grade_fn: str, memory_cap_bytes: int | None, preload: Sequence[str] = ()
) -> tuple[Callable[..., Any], int | None] | None:
    """Import the preload and resolve grade_fn, then cap memory; on failure tell the owner (`Fatal`)
    and return None."""
    try:
        import_preload(preload)
        return _resolve(grade_fn), _cap_memory(memory_cap_bytes)
    except Exception as exc:  # noqa: BLE001 - sent to the owner, which raises
        conn.send(Fatal(_format_exception(exc)))
        return None


def worker_main(
    conn: Any,
    grade_fn: str,
    expected_ppid: int,
    memory_cap_bytes: int | None = None,
    cpu_limit_s: float | None = None,
    preload: Sequence[str] = (),
) -> None:
    """Worker entry point: arm the death signal, cap memory, announce readiness, serve tasks."""
    enter_worker(expected_ppid)
    loaded = load_grader(conn, grade_fn, memory_cap_bytes, preload)
    if loaded is None:
        return
    conn.send(Ready(os.getpid()))
    serve(conn, loaded[0], cpu_limit_s, loaded[1])


# within this of the cap, the task's allocations were (nearly) refused even if it caught the
# MemoryError
_NEAR_CAP_BYTES = 32 * 2**20


def serve(conn: Any, fn: Callable[..., Any], cpu_limit_s: float | None, limit: int | None) -> None:
    """One task at a time until the owner closes the pipe (EOF -> quiet exit). A task that ran out
    of memory (a MemoryError, or an address space that reached the cap) is reported and the worker
    exits: its heap is not worth keeping."""
    while True:
        try:
            task: Task = conn.recv()
        except (EOFError, OSError):
            return
        reply: WorkerReply
        try:
            cap_cpu(cpu_limit_s)
            reply = Graded(fn(*task.args))
            if limit is not None and _peak_address_space() >= limit - _NEAR_CAP_BYTES:
                raise MemoryError(f"the task's address space reached the cap ({limit} bytes)")
        except MemoryError as exc:
            conn.send(OverMemory(f"MemoryError: {str(exc)[:_ERROR_HEAD_CHARS]}"))
            return
        except Exception as exc:  # noqa: BLE001 - sent to the owner, which raises
            reply = Raised(type(exc).__name__, _format_exception(exc))
        try:
            conn.send(reply)
        except OSError:
            return
        except Exception as exc:  # noqa: BLE001 - the result would not pickle; nothing was written
            conn.send(
                Raised(type(exc).__name__, "result could not be sent: " + _format_exception(exc))
            )
