"""The pool's side of its template process (scorers/grading/template.py) and of the workers forked
from it.

Why apart from the pool: the template speaks its own protocol (fork, warm, halt; forked, warmed,
exited), and the workers it forks are not our children: each is a `ClonedProcess` (handles.py)
whose exit status only the template can tell. This module is the one reader of those reports.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from multiprocessing import connection as mp_connection
from multiprocessing import reduction
from typing import Any

from scorers.grading.errors import GradingPoolError
from scorers.grading.handles import ClonedProcess, SpawnedProcess
from scorers.grading.messages import CloneExited, Fatal, Fork, Forked, Halt, Ready, Warm, Warmed
from scorers.grading.template import template_main

log = logging.getLogger(__name__)


class TemplateError(GradingPoolError):
    """The template failed to start, to fork, or to keep to its protocol; the pool adds its exit
    status."""

    def __init__(self, pid: int, what: str) -> None:
        super().__init__(f"grading template pid {pid} {what}")
        self.what = what


def pidfds_supported() -> bool:
    """Linux >= 5.3 (pidfd_open) is needed to watch workers the template forks."""
    try:
        fd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return False
    os.close(fd)
    return True


class GradingTemplate:
    """Owner of one template process: forks workers from it, hands it tasks to replay while the pool
    is idle, and collects its clones' exit statuses (the `CloneReaper` of each `ClonedProcess`)."""

    def __init__(
        self,
        ctx: Any,
        grade_fn: str,
        expected_ppid: int,
        memory_cap_bytes: int | None,
        cpu_limit_s: float | None,
        preload: tuple[str, ...] = (),
    ) -> None:
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(
            target=template_main,
            args=(child_conn, grade_fn, expected_ppid, memory_cap_bytes, cpu_limit_s, preload),
            name="grading-template",
            daemon=True,
        )
        try:
            process.start()
            self.process = SpawnedProcess(process)
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        self.conn = parent_conn
        self.pid: int = self.process.pid
        self.state = "starting"  # starting | idle | gone
        self.warming = False  # a warm request is unanswered (at most one is)
        self.can_warm = True  # until its replays grew it too much, or tainted it
        self.tainted = False  # a replay was stopped part way: fork no more workers from it
        self.replayed = 0
        self._requests = 0  # warm requests sent: each is answered by one "warmed" with its number
        self.rss = 0  # resident bytes after its last warming
        self._statuses: dict[int, int | None] = {}  # clones we watch -> exit code once reported

    def receive(self) -> None:
        """Read one message and act on it; raise TemplateError on a broken protocol or a failed
        load."""
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            self.state = "gone"  # its sentinel tells the pool how it ended
            return
        self._apply(message)

    def _apply(self, message: object) -> None:
        if isinstance(message, CloneExited):
            if message.pid in self._statuses:
                self._statuses[message.pid] = message.exitcode
        elif isinstance(message, Ready) and self.state == "starting":
            self.state = "idle"
        elif isinstance(message, Warmed):
            self._warmed(message)
        elif isinstance(message, Fatal):
            raise TemplateError(self.pid, f"cannot load the grader: {message.text}")
        else:
            raise TemplateError(
                self.pid, f"sent {type(message).__name__} while {self.state} (protocol error)"
            )

    def _warmed(self, message: Warmed) -> None:
        self.replayed, self.rss, self.can_warm, self.tainted = (
            message.replayed,
            message.rss,
            message.can_warm,
            message.tainted,
        )
        self.warming = message.number != self._requests
        log.debug(
            "grading template pid %d replayed %d tasks (%d raised)",
            self.pid,
            self.replayed,
            message.failed,
        )
        if self.tainted:
            log.warning(
                "grading template pid %d: a replay was stopped part way; it will be replaced",
                self.pid,
            )

    def fork(self, deadline: float) -> tuple[ClonedProcess, Any]:
        """A new worker and our end of its pipe; it announces itself (`Ready`) on that pipe."""
        parent_conn, child_conn = multiprocessing.Pipe(duplex=True)
        try:
            try:
                self.conn.send(Fork())
                reduction.send_handle(self.conn, child_conn.fileno(), self.pid)
            finally:
                child_conn.close()
            pid, pidfd = self._await_fork(deadline)
        except (EOFError, OSError) as exc:
            parent_conn.close()
            self.state = "gone"
            raise TemplateError(
                self.pid, f"pipe broke while forking a worker ({type(exc).__name__})"
            ) from exc
        except BaseException:
            parent_conn.close()
            raise
        self._statuses[pid] = None
        return ClonedProcess(pid, pidfd, self), parent_conn

    def _await_fork(self, deadline: float) -> tuple[int, int]:
        """Read (acting on other reports meanwhile) until the answer: `Forked`, then the pidfd right
        behind it."""
        while True:
            if not mp_connection.wait([self.conn], max(0.0, deadline - time.monotonic())):
                raise TemplateError(self.pid, "did not fork a worker in time")
            message = self.conn.recv()
            if isinstance(message, Forked):
                return message.pid, reduction.recv_handle(self.conn)
            self._apply(message)

    def warm(self, tasks: list[tuple]) -> None:
        """Replay these tasks while nothing else is asked of the template (unless it is still at the
        last ones)."""
        if tasks and self.can_warm and not self.warming and self.state == "idle":
            self._requests += 1
            self.warming = self._notify(Warm(self._requests, tasks))

    def halt(self) -> None:
        """Stop replaying (after the task in hand): the cores are the batch's now."""
        if self.warming and self.state == "idle":
            self._notify(Halt())

    def _notify(self, message: Warm | Halt) -> bool:
        """Send a message that needs no answer. A broken pipe means the template died: its state
        says so, and the pool's next look at it (every wait, every grade()) raises with its
        status."""
        try:
            self.conn.send(message)
        except OSError:
            self.state = "gone"
            return False
        return True

    def settle(self, deadline: float) -> bool:
        """Wait (bounded) until the replay in hand is done; True if it is."""
        while self.warming and self.state == "idle":
            if not mp_connection.wait([self.conn], max(0.0, deadline - time.monotonic())):
                return False
            self.receive()
        return not self.warming

    def status_of(self, pid: int) -> int | None:
        return self._statuses.get(pid)

    def drain(self) -> None:
        """Act on every message already waiting."""
        while self.state != "gone" and mp_connection.wait([self.conn], 0):
            self.receive()

    def await_status(self, pid: int, deadline: float) -> None:
        """Read the template's reports until it has told `pid`'s exit status, it is gone, or time is
        up. Used while reaping, so it never raises: a template that broke its protocol is given up
        on."""
        while self._statuses.get(pid) is None and self.state != "gone":
            if not mp_connection.wait([self.conn], max(0.0, deadline - time.monotonic())):
                return
            try:
                self.receive()
            except TemplateError as exc:
                log.error("%s; no longer reading it", exc)
                self.state = "gone"

    def forget(self, pid: int) -> None:
        self._statuses.pop(pid, None)

    def close(self, budget_s: float) -> None:
        """Close its pipe (it exits on EOF, its clones with it), SIGKILL it, reap it; bounded."""
        self.conn.close()
        self.state = "gone"
        self.process.kill()
        if not self.process.reap(budget_s):
            log.warning(
                "grading template pid %d alive %.1fs after SIGKILL; leaving it", self.pid, budget_s
            )
