"""Code that runs inside a grading worker (forked from the forkserver).

A worker arms PR_SET_PDEATHSIG so it dies with the forkserver even when stuck
in C code, drops its copy of the forkserver's "alive" pipe, announces
readiness, then grades one task at a time until its pipe closes.
"""

from __future__ import annotations

import importlib
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any

from child_runtime.lifeline import set_parent_death_signal

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


def worker_main(conn: Any, grade_fn: str, expected_ppid: int) -> None:
    """Worker entry point: arm the death signal, announce readiness, serve tasks."""
    set_parent_death_signal(signal.SIGKILL)
    if expected_ppid and os.getppid() != expected_ppid:
        # The forkserver died before prctl took effect: the signal will never come.
        os._exit(ORPHANED_EXIT_CODE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the owner's to handle; it kills us
    _drop_forkserver_alive_fd()
    try:
        fn = _resolve(grade_fn)
    except Exception as exc:  # noqa: BLE001 - sent to the owner, which raises
        conn.send(("fatal", _format_exception(exc)))
        return
    conn.send(("ready", os.getpid()))
    _serve(conn, fn)


def _serve(conn: Any, fn: Callable[..., Any]) -> None:
    """One task at a time until the owner closes the pipe (EOF -> quiet exit)."""
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        reply: tuple[Any, ...]
        try:
            reply = ("ok", fn(*task))
        except Exception as exc:  # noqa: BLE001 - sent to the owner, which raises
            reply = ("error", type(exc).__name__, _format_exception(exc))
        try:
            conn.send(reply)
        except OSError:
            return
        except Exception as exc:  # noqa: BLE001 - the result would not pickle; nothing was written
            conn.send(("error", type(exc).__name__, "result could not be sent: " + _format_exception(exc)))
