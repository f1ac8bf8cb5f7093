"""Code that runs inside a grading pool's template: the process its workers are forked from.

Why: a worker forked from the forkserver starts cold. Its grader's caches (math_verify's
parsers, sympy's) are empty, and it grades its first few dozen items 1.5-2x slower than a
veteran, which is exactly when a spare has just taken the slot of a slow task. The template
is a worker that never takes a task: while the pool is idle it replays a sample of the
pool's recent ordinary tasks (results thrown away), then freezes what that built
(gc.freeze), so every worker forked from it afterwards starts as warm as a veteran.

A fork request carries the new worker's end of its pipe (SCM_RIGHTS); the answer carries a
pidfd the template opened before it could reap the clone, so the owner never watches a reused
pid. The template reaps its clones and reports each exit status, the only place a non-child's
status can come from; a clone dies with the template (PR_SET_PDEATHSIG), as the template dies
with the forkserver. Each warm request gets exactly one `Warmed` answer (done, halted, or
ignored). A replayed task runs under the memory cap and is dropped after `REPLAY_CPU_S` of CPU
time (only tasks that graded fast are replayed, but a task is not bound to be as fast twice).
A dropped replay, or one that ran out of memory, was stopped at an arbitrary point of the
grader's code: the template reports itself tainted and the pool replaces it before the next batch.
"""

from __future__ import annotations

import gc
import os
import resource
import signal
import time
from collections import deque
from collections.abc import Callable
from multiprocessing import connection as mp_connection
from multiprocessing import reduction
from typing import Any

from scorers.common.processes import set_parent_death_signal
from scorers.grading.messages import CloneExited, Fork, Forked, Halt, Ready, Warm, Warmed
from scorers.grading.worker import ORPHANED_EXIT_CODE, cap_cpu, enter_worker, load_grader, serve

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# a replay taking this much CPU time is dropped (SIGPROF): the template must stay free to fork
REPLAY_CPU_S = 1.0
# a replay starts only once the pool has stayed idle this long: batches back to back (a scorer-bound
# stream's windows) never pay for a replay and its halt between them; a trainer generating does not
# notice
REPLAY_IDLE_S = 0.05
# a template whose replays grew it this much stops replaying: every worker forked from it starts
# that much bigger
MAX_GROWTH_BYTES = 64 * 2**20


def template_main(
    conn: Any,
    grade_fn: str,
    expected_ppid: int,
    memory_cap_bytes: int | None,
    cpu_limit_s: float | None,
    preload: tuple[str, ...] = (),
) -> None:
    """Template entry point: load the grader like a worker (the pool's preload too, where the
    forkserver lacks it), then serve fork and warm requests."""
    enter_worker(expected_ppid)
    loaded = load_grader(conn, grade_fn, memory_cap_bytes, preload)
    if loaded is None:
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # the wake-up byte is what matters
    signal.signal(signal.SIGPROF, _drop_replay)
    conn.send(Ready(os.getpid()))
    _Template(conn, grade_fn, memory_cap_bytes, cpu_limit_s, loaded[0], (wake_r, wake_w)).run()


class _Template:
    def __init__(
        self,
        conn: Any,
        grade_fn: str,
        memory_cap_bytes: int | None,
        cpu_limit_s: float | None,
        fn: Callable[..., Any],
        wake: tuple[int, int],
    ) -> None:
        self.conn, self.grade_fn, self.fn, self.wake = conn, grade_fn, fn, wake
        self.memory_cap_bytes, self.cpu_limit_s = memory_cap_bytes, cpu_limit_s
        self.replay: deque[tuple] = deque()
        # monotonic time the first replay of the warm request in hand may start
        self.replay_from = 0.0
        self.replaying = 0  # the warm request being served (its number), 0: none
        self.replayed_now = 0  # replays done for the warm request in hand
        self.replayed = self.failed = 0
        self.can_warm = True  # until the replays grew the template too much, or tainted it
        self.tainted = False
        self.start_rss = _rss()

    def run(self) -> None:
        """Until the owner closes the pipe: requests first, then reaping, then one replayed task."""
        while True:
            wait = max(self.replay_from - time.monotonic(), 0.0) if self.replay else None
            ready = mp_connection.wait([self.conn, self.wake[0]], wait)
            if self.wake[0] in ready:
                os.read(self.wake[0], 4096)
                self._reap()
            if self.conn in ready:
                try:
                    request = self.conn.recv()
                except (EOFError, OSError):
                    return  # the owner is done: our clones die with us
                self._handle(request)
            elif self.replay and time.monotonic() >= self.replay_from:
                self._replay_one()

    def _handle(self, request: Fork | Warm | Halt) -> None:
        if isinstance(request, Fork):
            self._fork()
        elif isinstance(request, Warm):
            self.replaying, self.replayed_now = request.number, 0
            self.replay_from = time.monotonic() + REPLAY_IDLE_S
            if self.can_warm:
                self.replay.extend(request.tasks)
            if not self.replay:
                self._finish_warming()
        elif isinstance(request, Halt):
            if self.replaying:
                self._finish_warming()
        else:
            raise ValueError(f"grading template: unknown request {request!r}")

    def _fork(self) -> None:
        """Fork a worker onto the pipe end that follows the request; answer its pid, then its
        pidfd."""
        fd = reduction.recv_handle(self.conn)
        template_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            self._become_worker(fd, template_pid)  # never returns
        os.close(fd)
        # before we could reap it: it is this child, whatever happens next
        pidfd = os.pidfd_open(pid)
        try:
            self.conn.send(Forked(pid))
            reduction.send_handle(self.conn, pidfd, 0)
        finally:
            os.close(pidfd)

    def _replay_one(self) -> None:
        global _replaying
        task = self.replay.popleft()
        cpu_limits = resource.getrlimit(resource.RLIMIT_CPU)
        try:
            try:
                cap_cpu(self.cpu_limit_s)  # the backstop, should the grader be stuck in C code
                _replaying = True
                # again and again, should a grader swallow it
                signal.setitimer(signal.ITIMER_PROF, REPLAY_CPU_S, 0.1)
                self.fn(*task)
            finally:
                _replaying = False  # first: a SIGPROF handled from here on is ignored
                signal.setitimer(signal.ITIMER_PROF, 0)
                # forks and reaping count after this
                resource.setrlimit(resource.RLIMIT_CPU, cpu_limits)
        except (MemoryError, _ReplayTooSlow):
            self.tainted, self.can_warm = True, False
        except Exception:  # noqa: BLE001 - the pool graded this task already; a replay only warms caches
            self.failed += 1
        self.replayed += 1
        self.replayed_now += 1
        if not self.replay or self.tainted:
            self._finish_warming()

    def _finish_warming(self) -> None:
        """Answer the warm request; drop what is left to replay; keep what the replays built out of
        every clone's collections (no replay ran: nothing to collect, the next batch keeps the
        cores)."""
        self.replay.clear()
        if self.replayed_now:
            gc.collect()
            gc.freeze()
        rss = _rss()
        if rss > self.start_rss + MAX_GROWTH_BYTES:
            self.can_warm = False
        number, self.replaying = self.replaying, 0
        self.conn.send(Warmed(number, self.replayed, self.failed, rss, self.can_warm, self.tainted))

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.conn.send(CloneExited(pid, os.waitstatus_to_exitcode(status)))

    def _become_worker(self, fd: int, template_pid: int) -> None:
        """In the fresh clone: drop the template's pipes and handlers, then serve like any
        worker."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            # interval timers are not inherited; the handler is
            signal.signal(signal.SIGPROF, signal.SIG_DFL)
            for own in self.wake:
                os.close(own)
            set_parent_death_signal(signal.SIGKILL)
            if os.getppid() != template_pid:
                os._exit(ORPHANED_EXIT_CODE)
            self.conn.close()
            conn = mp_connection.Connection(fd)
            loaded = load_grader(conn, self.grade_fn, self.memory_cap_bytes)
            if loaded is not None:
                conn.send(Ready(os.getpid()))
                serve(conn, loaded[0], self.cpu_limit_s, loaded[1])
                code = 0
        finally:
            os._exit(code)


class _ReplayTooSlow(BaseException):
    """Raised in a replay past REPLAY_CPU_S; a BaseException, so a grader's `except Exception`
    cannot keep it running."""


_replaying = False  # set only around a replay: a SIGPROF that lands after it is ignored


def _drop_replay(signum: int, frame: Any) -> None:
    if _replaying:
        raise _ReplayTooSlow


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_SIZE
