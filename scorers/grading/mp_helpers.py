"""Ownership of multiprocessing's process-global helpers (forkserver, resource tracker).

The first worker start launches them. Pools own the ones they launched: when
the last live pool closes, those are stopped (bounded), so close() leaves no
process behind; helpers that were already running belong to someone else.
This is the one place that touches multiprocessing's private attributes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from scorers.common.processes import describe
from scorers.grading.handles import HelperProcess

log = logging.getLogger(__name__)

_CAUSE_CHARS = 2000  # of a failed import's traceback: its end, where the exception is


def forkserver_pid(ensure: bool = True) -> int:
    """Pid of the forkserver (started first if needed, unless not `ensure`), or 0 if multiprocessing
    hides it (or none was started)."""
    from multiprocessing import forkserver

    if ensure:
        forkserver.ensure_running()
    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None) or 0


def preload_failure(modules: Sequence[str], timeout_s: float) -> str:
    """What importing `modules` raises in a fresh interpreter of this Python and sys.path (bounded):
    why a forkserver that preloads them died, said where its own traceback is only in its log."""
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    argv = [sys.executable, "-c", code, *modules]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"importing its preload {list(modules)} afresh did not end within {timeout_s:.0f} s"
    except OSError as exc:
        return f"its preload could not be imported afresh to say why ({exc})"
    if done.returncode == 0:
        return (
            f"its preload {list(modules)} imports afresh without error: it was killed, or "
            f"failed only there"
        )
    return (
        f"importing its preload afresh fails ({describe(done.returncode)}): "
        f"{done.stderr.strip()[-_CAUSE_CHARS:]}"
    )


_helpers_lock = threading.Lock()
_live_pools = 0
_owned_helpers: list[str] = []
# helpers start_forkserver_early launched, for the first pool to own
_started_early: list[str] | None = None
# forkserver pid -> what it preloads, for those launched here
_preloaded: dict[int, tuple[str, ...]] = {}
# the forkserver's children that pools asked for (workers, templates)
_pool_children: set[int] = set()
# preloaded first: no ^C and no collections during the preload
ENTER_MODULE = "scorers.grading.forkserver_enter"
# preloaded last: workers never collect the preloaded heap
FREEZE_MODULE = "scorers.grading.forkserver_gc"


def forkserver_modules(preload: Sequence[str], grade_fn: str) -> list[str]:
    """What a pool's forkserver preloads: ^C ignored and the collector paused, its modules, the
    grade function's, then the heap freeze (which resumes the collector)."""
    return list(dict.fromkeys([ENTER_MODULE, *preload, grade_fn.partition(":")[0], FREEZE_MODULE]))


def start_forkserver_early(modules: Sequence[str]) -> None:
    """Launch the forkserver (and the resource tracker) now, preloading `modules`, without waiting
    for it: a child that starts it before its own imports overlaps the two (the preload is the slow
    part of a math child's start). The first pool started afterwards owns what this launched, as if
    it had launched them itself; a forkserver already running is left as it is."""
    global _started_early
    with _helpers_lock:
        if _live_pools or _started_early is not None:
            return
        fresh = [
            n for n, h in _helper_objects().items() if h is not None and _helper_pid(h) is None
        ]
        _ensure_preloading(modules)
        _started_early = fresh


def serving_forkserver(modules: Sequence[str]) -> bool:
    """Make sure the forkserver runs, launched now with `modules` preloaded if none does; True if
    the one that runs preloads them (it was launched so by a pool, or by `start_forkserver_early`).

    A pool calls this before anything of it runs in a thread: the launch is then over before the
    caller's next line, and a `set_forkserver_preload` the caller makes afterwards cannot slip in
    first (it changes only what a forkserver launched later preloads). The caller's own preload list
    is put back, so a forkserver multiprocessing launches for the caller once the pools stopped this
    one preloads what the caller asked for. False (a forkserver someone else launched, preloading
    other modules): the pool forks its workers from a template that imports the modules itself."""
    with _helpers_lock:
        return _ensure_preloading(modules)


def _ensure_preloading(modules: Sequence[str]) -> bool:
    from multiprocessing import forkserver

    server = _helper_objects()["forkserver"]
    before = _helper_pid(server)
    theirs = list(getattr(server, "_preload_modules", ["__main__"]))
    forkserver.set_forkserver_preload(list(modules))
    try:
        forkserver.ensure_running()
    finally:
        forkserver.set_forkserver_preload(theirs)
    pid = _helper_pid(server)
    if pid is not None and pid != before:
        _preloaded[pid] = tuple(modules)
    return pid is not None and set(modules) <= set(_preloaded.get(pid, ()))


def note_pool_child(pid: int) -> None:
    """A worker or template a pool asked the forkserver for: not a process of the caller's own, when
    the last pool decides whether the forkserver it launched still serves someone else."""
    with _helpers_lock:
        _pool_children.add(pid)


def forget_pool_child(pid: int) -> None:
    """The pool reaped it: its pid may be the caller's next (the set holds only what is alive)."""
    with _helpers_lock:
        _pool_children.discard(pid)


def _helper_objects() -> dict[str, Any]:
    from multiprocessing import forkserver, resource_tracker

    return {
        "forkserver": getattr(forkserver, "_forkserver", None),
        "resource_tracker": getattr(resource_tracker, "_resource_tracker", None),
    }


def _helper_pid(helper: Any) -> int | None:
    return getattr(helper, "_forkserver_pid", None) or getattr(helper, "_pid", None)


def acquire_helpers() -> None:
    """Count a live pool; the first one notes which helpers it is about to launch (or which were
    launched early for it)."""
    global _live_pools, _started_early
    with _helpers_lock:
        if _live_pools == 0:
            if _started_early is not None:
                _owned_helpers[:], _started_early = _started_early, None
            else:
                fresh = [
                    n
                    for n, h in _helper_objects().items()
                    if h is not None and _helper_pid(h) is None
                ]
                _owned_helpers[:] = fresh
        _live_pools += 1


def release_helpers(budget_s: float) -> None:
    """Uncount a pool; the last one stops the helpers the pools launched, but for a forkserver that
    still serves the caller's own processes (the caller forked from it meanwhile: stopping it now
    would make multiprocessing report each of them as exit 255). That one is left to end with this
    process, as multiprocessing's own helpers do."""
    global _live_pools
    # held while stopping, so a pool starting meanwhile can't use a dying helper
    with _helpers_lock:
        _live_pools -= 1
        if _live_pools > 0:
            return
        owned, _owned_helpers[:] = list(_owned_helpers), []
        helpers = _helper_objects()
        server_pid = _helper_pid(helpers["forkserver"])
        if "forkserver" in owned and server_pid is not None:
            others = _children(server_pid) - _pool_children
            if others:
                log.info(
                    "multiprocessing forkserver pid %d left running: it serves pids %s",
                    server_pid,
                    sorted(others),
                )
                owned = []  # the tracker stays with it (the forkserver's processes may use it)
        _pool_children.clear()
        for name in owned:  # forkserver first: its exit releases the tracker's pipe
            if name == "forkserver" and server_pid is not None:
                _preloaded.pop(server_pid, None)
            _stop_helper(name, helpers[name], budget_s)


def _children(pid: int) -> set[int]:
    """The live children of `pid` (zombies, already dead, left out), from /proc."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            pids = {int(word) for word in listing.read().split()}
    except (FileNotFoundError, ProcessLookupError):
        return set()
    return {child for child in pids if _state(child) not in ("Z", "X", "")}


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return ""


def _stop_helper(name: str, helper: Any, budget_s: float) -> None:
    """multiprocessing's own `_stop()` (closes the alive pipe, then an unbounded
    waitpid), run in a thread so that we can bound it: SIGKILL on overrun."""
    pid, stop = _helper_pid(helper), getattr(helper, "_stop", None)
    if pid is None or stop is None:
        return

    def run_stop() -> None:
        try:
            stop()
        except ChildProcessError:  # someone else reaped it (e.g. SIGCHLD ignored)
            log.warning("multiprocessing %s pid %d was already reaped elsewhere", name, pid)

    thread = threading.Thread(target=run_stop, name=f"stop-{name}", daemon=True)
    thread.start()
    thread.join(budget_s)
    if thread.is_alive():
        log.warning(
            "multiprocessing %s pid %d did not exit within %.1fs; sending SIGKILL",
            name,
            pid,
            budget_s,
        )
        process = HelperProcess(pid, thread)
        process.kill()
        if not process.reap(budget_s):
            log.warning("multiprocessing %s pid %d still not reaped; leaving it", name, pid)
