"""A forkserver process pool for CPU-bound grading with hard per-item timeouts.

Why not `multiprocessing.Pool`: its `terminate()` joins without a bound, a
worker stuck in C code can't be interrupted, and a timed-out task can't be
cancelled without losing the whole pool. Here (as in pebble) each worker runs
one task at a time over its own pipe, so a timed-out task costs exactly one
SIGKILLed worker; and (as in loky) the parent waits on result pipes *and*
worker sentinels, so a worker that dies is noticed at once, not at a timeout.

Workers fork from a forkserver that has already imported the heavy modules
(`preload`), so starting or replacing one costs a fork, not an import; what the preload
built is frozen (gc.freeze), so no worker's full collection walks it. With `warm_replay`,
they fork instead from a template (a child of the forkserver) that replays some of each
batch's ordinary tasks once the batch is done, so a worker started mid-batch (a spare, a
replacement) has the grader's caches of a veteran (scorers/grading/template.py).

A task that has used its soft deadline (well under its timeout) in CPU time stops holding
one of the `jobs` ordinary slots. CPU time, so that a busy or shared machine, which slows
every task alike, moves no ordinary one; a task that waits rather than computes moves once
it has held its slot for `WAIT_FACTOR` soft deadlines. Its worker becomes an overflow worker
(at most `overflow` of them) and a spare worker, started ahead, takes the slot at once (then
the next spare forks). While ordinary tasks remain, overflow workers are stopped (SIGSTOP),
so ordinary grading keeps every core, and their clocks stop with them; once the ordinary
tasks are done they continue (SIGCONT) and finish or are killed when they have run for their
timeout. A slow task thus gets its whole timeout of running time, never a starved share of
it, and the batch costs its ordinary work plus about one timeout. An overflow worker is
retired after its task; retired workers are killed at once and reaped once gone (those still
exiting when grade() returns, as a large heap takes 0.1 s to free, by the next grade() or
close()). The held tasks together may keep at most `memory_budget_bytes` of private memory
(each one's own cap times the overflow bound would allow 8 GiB; a task's memory is its worker's
growth since it was ready): past it, the largest are killed, outcome "budget". Each worker's address space is capped (a task past `memory_cap_bytes` fails with
MemoryError: outcome "memory", the worker exits) and each task's CPU time is capped by the
kernel (RLIMIT_CPU, outcome "cpu"), a backstop to the timeout. A worker whose memory grew
while grading is replaced, so the pool returns to its size after a hostile batch.

Liveness chain: the owner holds the forkserver's "alive" pipe; workers drop
their inherited copy of it, so when the owner dies the forkserver sees EOF and
exits, and every worker dies with it through PR_SET_PDEATHSIG -- even one stuck
in C code (a template's workers die with the template, which dies with the forkserver).

`grade()` may be called from several threads at once (a managed child scores the chunks of one
call concurrently): their batches share the workers, and a slow task of one batch is held
back while ordinary tasks of any batch remain, so the call's chunks pay one timeout between
them, not one each. Whichever caller holds the pool's drive lock runs the event loop for
every batch in flight and hands it on when its own batch is done (leader/follower): a
caller whose batch the driver finished returns at once, and the pool's state is only ever
touched by one thread. Call `close()` when no grade() runs.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from typing import Any

from scorers.grading.errors import GradingPoolError, GradingTaskError
from scorers.grading.mp_helpers import acquire_helpers, forkserver_pid, release_helpers
from scorers.grading.processes import describe
from scorers.grading.template_owner import CloneProcess, GradingTemplate, TemplateError, pidfds_supported
from scorers.grading.worker import ORPHANED_EXIT_CODE, worker_main

log = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 60.0
_REAP_TIMEOUT_S = 2.0
_FORK_TIMEOUT_S = 10.0  # the template answers between two replayed tasks
_DRIVE_SLACK_S = 30.0  # past a batch's hard cap, how long its caller waits for the thread driving the pool
_HANDOFF_S = 0.02  # how often a caller that does not drive looks whether the drive lock came free
_CLOSE_WAIT_S = 5.0  # how long close() waits for a grade() in flight to see the pool closed
_DEATH_STATUS_WAIT_S = 2.0  # a template reports a worker's status between two replayed tasks (<= 1 s each)
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_CPU_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# CPU time: with the forkserver's heap frozen (no 60 ms full collections mid-item), an ordinary item
# takes milliseconds, the slowest of 3,000 about 0.06 s
DEFAULT_SOFT_TIMEOUT_S = 0.1
# held tasks are stopped and cost only memory (each under the cap); a small pool keeps room for a few
# ordinary items that pass the soft deadline beside its pathological ones
MIN_OVERFLOW = 16
WAIT_FACTOR = 4  # a task holding its slot this many soft deadlines moves whatever CPU time it used
DEFAULT_MEMORY_CAP_BYTES = 512 * 2**20  # beyond what a freshly forked worker maps
# the private memory of all held tasks together: one item at its cap, whatever the overflow bound
DEFAULT_MEMORY_BUDGET_BYTES = DEFAULT_MEMORY_CAP_BYTES
_BUDGET_CHECK_S = 0.05  # how often the held tasks' memory is read while there are any
RECYCLE_GROWTH_BYTES = 64 * 2**20  # a worker this much above its start RSS is replaced after its task
_FREEZE_MODULE = "scorers.grading.forkserver_gc"  # preloaded last: workers never collect the preloaded heap


@dataclass(frozen=True)
class GradeOutcome:
    """One task's outcome: `value` is grade_fn's result when status is "ok", else None."""

    # "ok" | "timeout" | "memory" (past the memory cap) | "cpu" (past the CPU-time cap) | "budget" (held
    # tasks together past the pool's memory budget)
    status: str
    value: Any
    elapsed_s: float
    overflowed: bool = False  # it passed the soft deadline and finished (or not) in an overflow worker
    finished_at: float = field(default_factory=time.monotonic, compare=False)  # when the owner recorded it


@dataclass(eq=False)
class _Worker:
    """Owner-side record of one worker: its process, pipe, and what it is doing."""

    process: Any
    conn: Any
    pid: int  # cached: a closed Process object no longer tells its pid
    since: float
    state: str = "starting"  # starting | idle | busy
    task_index: int = -1
    batch: _Batch | None = None  # the batch its task belongs to, while busy
    # ordinary (one of the `jobs` slots) | overflow (one slow task, then retired) | spare (takes the slot
    # of the next task moved to overflow at once, instead of after a fork)
    role: str = "ordinary"
    start_rss: int = 0
    cpu_base: float = 0.0  # its CPU seconds when it last became idle: a task's CPU time is counted from it
    soft_check_at: float = math.inf  # when its task's CPU time is next compared with the soft deadline
    stopped_at: float | None = None  # an overflow worker held back (SIGSTOP) while ordinary tasks remain
    stopped_s: float = 0.0  # how long its task has been held back: not counted against its timeout

    def deadline(self, timeout_s: float) -> float:
        """When its task has run for `timeout_s`; never while it is stopped."""
        return math.inf if self.stopped_at is not None else self.since + self.stopped_s + timeout_s

    def doing(self) -> str:
        if self.state == "busy":
            return f"while grading task {self.task_index}"
        return "while starting" if self.state == "starting" else "while idle"


@dataclass(eq=False)
class _Batch:
    """One grade() call in flight."""

    tasks: list[tuple]
    deadline: float
    label: str
    outcomes: list[GradeOutcome | None]
    pending: deque[int] = field(default_factory=deque)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # why it failed (set before `done`)
    cancelled: bool = False  # its caller gave up (Ctrl-C) while another thread drove the pool


_WORKER_EXIT_MEANINGS = {
    255: "or the forkserver itself died",
    ORPHANED_EXIT_CODE: "forkserver gone before the worker started",
}


def overflow_options(
    jobs: int, timeout_s: float, soft_timeout_s: float | None, overflow: int | None
) -> tuple[float, int]:
    """The soft deadline and overflow bound with their defaults applied; a bad one is refused."""
    if soft_timeout_s is None:
        soft_timeout_s = min(DEFAULT_SOFT_TIMEOUT_S, timeout_s / 2)
    if isinstance(soft_timeout_s, bool) or not isinstance(soft_timeout_s, (int, float)):
        raise TypeError(f"soft_timeout_s must be a number, got {type(soft_timeout_s).__name__}")
    if not 0 < soft_timeout_s < timeout_s:
        raise ValueError(f"soft_timeout_s must be > 0 and below timeout_s={timeout_s}, got {soft_timeout_s!r}")
    overflow = max(MIN_OVERFLOW, 4 * jobs) if overflow is None else overflow
    if not isinstance(overflow, int) or isinstance(overflow, bool) or overflow < 0:
        raise ValueError(f"overflow must be an int >= 0, got {overflow!r}")
    return float(soft_timeout_s), overflow


def describe_exitcode(code: int | None) -> str:
    """A worker's multiprocessing exitcode in words (negative means killed by a signal)."""
    if code is None:
        return "exit status unknown (still running?)"
    return describe(code, _WORKER_EXIT_MEANINGS)


class GradingPool:
    """Forkserver workers, one task each at a time, hard per-task timeouts.

    `grade_fn` is "module:function", importable in the child (our packages or extra_import_paths); it gets
    each task's tuple as positional args and returns a picklable result.
    """

    def __init__(
        self,
        jobs: int,
        timeout_s: float,
        grade_fn: str,
        preload: Sequence[str] = (),
        soft_timeout_s: float | None = None,
        overflow: int | None = None,
        memory_cap_bytes: int | None = DEFAULT_MEMORY_CAP_BYTES,
        warm_replay: int = 0,
        memory_budget_bytes: int | None = DEFAULT_MEMORY_BUDGET_BYTES,
    ) -> None:
        """`soft_timeout_s`: None = min(0.1 s, timeout_s / 2). `overflow`: the most tasks moved out of
        the ordinary slots at once; None = max(16, 4 x jobs), 0 = never move one. `memory_cap_bytes`: None = no cap.
        `warm_replay`: workers fork from a template that replays up to this many of each batch's ordinary
        tasks once the batch is done (grade_fn must be free of side effects); 0 = they fork from the forkserver."""
        if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
            raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise TypeError(f"timeout_s must be a number, got {type(timeout_s).__name__}")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be finite and > 0, got {timeout_s!r}")
        soft_timeout_s, overflow = overflow_options(jobs, timeout_s, soft_timeout_s, overflow)
        if memory_cap_bytes is not None and (
            not isinstance(memory_cap_bytes, int) or isinstance(memory_cap_bytes, bool) or memory_cap_bytes < 2**20
        ):
            raise ValueError(f"memory_cap_bytes must be an int >= 1 MiB or None, got {memory_cap_bytes!r}")
        if memory_budget_bytes is not None and (
            not isinstance(memory_budget_bytes, int)
            or isinstance(memory_budget_bytes, bool)
            or memory_budget_bytes < 2**20
        ):
            raise ValueError(f"memory_budget_bytes must be an int >= 1 MiB or None, got {memory_budget_bytes!r}")
        module_name, sep, attr = grade_fn.partition(":") if isinstance(grade_fn, str) else ("", "", "")
        if not (module_name and sep and attr):
            raise ValueError(f"grade_fn must be 'module:function', got {grade_fn!r}")
        if isinstance(preload, str) or not all(isinstance(m, str) and m for m in preload):
            raise TypeError(f"preload must be a sequence of module names, got {preload!r}")
        if not isinstance(warm_replay, int) or isinstance(warm_replay, bool) or warm_replay < 0:
            raise ValueError(f"warm_replay must be an int >= 0, got {warm_replay!r}")
        self.jobs = jobs
        self.timeout_s = float(timeout_s)
        self.soft_timeout_s = float(soft_timeout_s)
        self.overflow = overflow
        self.memory_cap_bytes = memory_cap_bytes
        self.memory_budget_bytes = memory_budget_bytes
        self._budget_check_at = 0.0
        self.grade_fn = grade_fn
        self.preload = tuple(preload)
        self.warm_replay = warm_replay
        self._batch_slack_s = 60.0
        self._ctx = multiprocessing.get_context("forkserver")
        self._workers: list[_Worker] = []
        self._state = "new"  # new | running | broken | closed
        self._broken: GradingPoolError | None = None
        self._holds_helpers = False
        self._retired: list[_Worker] = []  # killed; reaped when gone, at the latest by the next grade() or close()
        self._template: GradingTemplate | None = None
        self._batches: list[_Batch] = []  # in flight, oldest first (touched only by the drive lock's holder)
        self._arriving: list[_Batch] = []  # handed in by grade() callers, adopted by the driver
        self._intake = threading.Lock()  # guards _arriving
        self._drive = threading.Lock()  # its holder runs the event loop for every batch
        self._sample: list[tuple] = []  # what the template replays once the pool is idle
        self._wake_r, self._wake_w = os.pipe()  # a batch handed in wakes the driver's wait
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # ---------------------------------------------------------------- public

    def start(self) -> None:
        """Start the workers and wait (bounded) until each has loaded grade_fn."""
        if self._state != "new":
            raise GradingPoolError(f"GradingPool.start() called twice (pool is {self._state})")
        self._state = "running"
        acquire_helpers()
        self._holds_helpers = True
        modules = [*self.preload, self.grade_fn.partition(":")[0], _FREEZE_MODULE]
        # Only effective if this process's forkserver is not running yet (process-global).
        self._ctx.set_forkserver_preload(list(dict.fromkeys(modules)))
        try:
            self._start_workers()
        except BaseException as exc:
            self._fail(exc)
            raise

    def _start_workers(self) -> None:
        """The template (with `warm_replay`), `jobs` workers and the spare, ready within the startup timeout."""
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        if self.warm_replay:
            self._start_template(deadline)
        for _ in range(self.jobs):
            self._spawn()
        if self.overflow:
            self._spawn("spare")
        while any(w.state == "starting" for w in self._workers):
            self._step(deadline, "worker startup")

    def grade(self, tasks: Sequence[tuple]) -> list[GradeOutcome]:
        """Grade every task; "timeout" outcomes for tasks past timeout_s; raise on failure. Several
        threads may grade at once: their batches share the workers (see the module docstring)."""
        self._check_usable()
        tasks = list(tasks)
        for index, task in enumerate(tasks):
            if not isinstance(task, tuple):
                raise TypeError(f"tasks[{index}] must be a tuple of args, got {type(task).__name__}")
        if not tasks:
            return []
        cap_s = self.batch_cap_s(len(tasks))
        label = f"batch of {len(tasks)} tasks (hard cap {cap_s:.0f}s)"
        batch = _Batch(tasks, time.monotonic() + cap_s, label, [None] * len(tasks), deque(range(len(tasks))))
        with self._intake:
            self._arriving.append(batch)
        self._wake()
        try:
            while not batch.done.is_set():
                if self._drive.acquire(blocking=False):
                    try:
                        self._drive_until(batch)
                    finally:
                        self._drive.release()
                    continue
                # another caller drives: it finishes this batch too (set at once), or hands the loop on
                # when its own is done (taken here within _HANDOFF_S)
                if not batch.done.wait(_HANDOFF_S) and time.monotonic() > batch.deadline + _DRIVE_SLACK_S:
                    raise GradingPoolError(f"{label}: unfinished at its hard cap, and the pool's driver is stuck")
        except BaseException:
            if not batch.done.is_set():  # another thread drives: it drops the batch at its next look
                batch.cancelled = True
                self._wake()
            raise
        if batch.error is not None:
            raise batch.error
        return list(batch.outcomes)  # type: ignore[arg-type]

    def _drive_until(self, batch: _Batch) -> None:
        """The event loop for every batch in flight, until `batch` is done. Holds the drive lock."""
        try:
            while True:
                self._adopt()
                if batch.done.is_set():
                    return
                if self._state != "running" or not self._batches:  # closed under us (or a bug): never spin
                    for pending in [*self._batches, batch]:
                        self._finish(pending, self._broken or GradingPoolError("grading pool was closed"))
                    return
                self._dispatch()
                self._step(min(b.deadline for b in self._batches), "grading")
                self._settle_batches()
        except BaseException as exc:
            self._fail(exc)  # every batch in flight fails with the pool
            raise

    def _adopt(self) -> None:
        """Take in the batches handed over since the last look; drop those their callers gave up on."""
        with self._intake:
            arriving, self._arriving = self._arriving, []
        if self._state != "running":
            for batch in arriving:
                self._finish(batch, self._broken or GradingPoolError("grading pool is closed"))
            return
        was_idle = not self._batches
        now = time.monotonic()
        for batch in arriving:  # in the list at once: a failure below (the template) fails them with the rest
            # its hard cap counts the work queued ahead of it: it shares the workers with the other batches
            ahead = sum(len(b.pending) for b in self._batches) + sum(w.state == "busy" for w in self._workers)
            batch.deadline = now + self.batch_cap_s(ahead + len(batch.tasks))
            self._batches.append(batch)
        if arriving and was_idle:  # the pool was idle: its last killed workers go, the template stops
            self._reap_retired()
            if self._template is not None:
                self._template_between_batches()
        for batch in [b for b in self._batches if b.cancelled]:
            self._abort_batch(batch, GradingPoolError(f"{batch.label}: its caller gave up"))

    def _settle_batches(self) -> None:
        """Hand back each batch with nothing left to grade; once none is left, the template replays."""
        finished = [
            b
            for b in self._batches
            if not b.pending and not any(w.batch is b for w in self._workers if w.state == "busy")
        ]
        for batch in finished:
            if self._template is not None:
                self._sample = self._replay_sample(batch)
            self._finish(batch)
        if finished and not self._batches:
            self._reap_retired(wait=False)  # a killed worker with a large heap takes 0.1 s to exit: not ours to wait
            with self._intake:
                idle = not self._arriving
            if idle and self._template is not None and self._sample:
                self._template.warm(self._sample)
                self._sample = []

    def _finish(self, batch: _Batch, error: BaseException | None = None) -> None:
        if batch in self._batches:
            self._batches.remove(batch)
        if error is not None:
            batch.pending.clear()
            batch.error = error
        batch.done.set()

    def _abort_batch(self, batch: _Batch, error: BaseException) -> None:
        """One batch fails (a task raised, its caller gave up): its workers in flight are replaced
        (their replies would be read as another task's), the other batches go on."""
        self._retire(*[w for w in self._workers if w.state == "busy" and w.batch is batch])
        self._finish(batch, error)

    def _wake(self) -> None:
        with self._intake:  # never a write to a closed pipe's number, which another file may have taken
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # already awake: the pipe is full
                pass

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Wait (bounded) until the template has replayed the last batch; True if it has (or there is none).
        A trainer never needs this (the replay runs while it generates); a benchmark does, to time batches
        on an otherwise idle machine."""
        self._check_usable()
        with self._drive:
            if self._template is None:
                return True
            try:
                return self._template.settle(time.monotonic() + timeout_s) and self._template.state != "gone"
            except TemplateError as exc:
                raise self._template_failed(exc.what) from exc

    def batch_cap_s(self, n_tasks: int) -> float:
        """Hard cap on one grade() call: every round of tasks may take 3x its timeout."""
        return 3 * self.timeout_s * math.ceil(n_tasks / self.jobs) + self._batch_slack_s

    @property
    def broken(self) -> bool:
        """A worker or IPC failure (or the batch cap) broke the pool; only a new pool can grade."""
        return self._state == "broken"

    def worker_pids(self) -> list[int]:
        """Pids of the workers holding or waiting on tasks, not the spare (for tests and diagnostics)."""
        return [w.pid for w in self._workers if w.role != "spare"]

    def spare_pids(self) -> list[int]:
        return [w.pid for w in self._workers if w.role == "spare"]

    def template_pid(self) -> int | None:
        """The process workers fork from when `warm_replay` is on (None: they fork from the forkserver)."""
        return None if self._template is None else self._template.pid

    def close(self) -> None:
        """SIGKILL and reap every worker; the last pool also stops the helpers. Bounded, idempotent."""
        if self._state == "closed":
            return
        self._state = "closed"
        self._wake()  # a grade() in flight sees the pool closed at its next look, and lets go of it
        driving = self._drive.acquire(timeout=_CLOSE_WAIT_S)
        try:
            if not driving:
                log.warning("grading pool: a grade() still runs after %.0f s; closing under it", _CLOSE_WAIT_S)
            self._kill_workers()
            self._close_template()
            with self._intake:
                fds, (self._wake_r, self._wake_w) = (self._wake_r, self._wake_w), (-1, -1)
            for fd in fds:
                os.close(fd)
        finally:
            if driving:
                self._drive.release()
        if self._holds_helpers:
            self._holds_helpers = False
            release_helpers(_REAP_TIMEOUT_S)

    def __enter__(self) -> GradingPool:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    def _check_usable(self) -> None:
        """Refuse to grade unless running; a broken pool repeats its original cause."""
        if self._state == "running":
            return
        if self._state == "broken":
            raise GradingPoolError(f"grading pool is broken: {self._broken}") from self._broken
        raise GradingPoolError("grading pool is not started" if self._state == "new" else "grading pool is closed")

    def _spawn(self, role: str = "ordinary") -> _Worker:
        """Start one worker with its own duplex pipe (forked by the template if there is one, else by the
        forkserver); the owner keeps one end only."""
        if self._template is not None:
            try:
                process, parent_conn = self._template.fork(time.monotonic() + _FORK_TIMEOUT_S)
            except TemplateError as exc:
                raise self._template_failed(exc.what) from exc
        else:
            process, parent_conn = self._fork_from_forkserver()
        worker = _Worker(process, parent_conn, process.pid, since=time.monotonic(), role=role)
        self._workers.append(worker)
        return worker

    def _fork_from_forkserver(self) -> tuple[Any, Any]:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main,
            args=(child_conn, self.grade_fn, forkserver_pid(), self.memory_cap_bytes, self.timeout_s + 1.0),
            name="grading-worker",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()  # else a dead worker's pipe would never read EOF
        if process.pid is None:  # start() returned, so it has one; the type does not say so
            raise GradingPoolError("grading worker started without a pid")
        return process, parent_conn

    def _start_template(self, deadline: float) -> None:
        """Start the template the workers fork from and wait (bounded) until it has loaded grade_fn."""
        if not pidfds_supported():
            log.warning("grading pool: this kernel has no pidfd_open (Linux < 5.3); workers fork from the forkserver")
            return
        template = GradingTemplate(
            self._ctx, self.grade_fn, forkserver_pid(), self.memory_cap_bytes, self.timeout_s + 1.0
        )
        self._template = template
        while template.state == "starting":
            ready = mp_connection.wait(
                [template.conn, template.process.sentinel], max(0.0, deadline - time.monotonic())
            )
            if not ready:
                raise self._template_failed(f"not ready after {_STARTUP_TIMEOUT_S:.0f}s")
            self._from_template(ready)

    def _from_template(self, ready: list[Any]) -> None:
        """Act on the template's messages and on its death, if they are among `ready`."""
        template = self._template
        if template is None:
            return
        try:
            if template.conn in ready:
                template.receive()
        except TemplateError as exc:
            raise self._template_failed(exc.what) from exc
        if template.process.sentinel in ready or template.state == "gone":
            raise self._template_failed("exited unexpectedly (its workers die with it)")

    def _template_failed(self, what: str) -> GradingPoolError:
        template = self._template
        assert template is not None
        if template.state == "gone" or not template.process.is_alive():
            template.process.join(_DEATH_STATUS_WAIT_S)  # it is exiting: its status is moments away
        return GradingPoolError(
            f"grading template pid {template.pid} {what}: {describe_exitcode(template.process.exitcode)}"
        )

    def _template_between_batches(self) -> None:
        """Read what the template reported while we were idle; replace it if a replay left it tainted;
        then halt its replay: the cores are the batch's."""
        template = self._template
        assert template is not None
        try:
            template.drain()
        except TemplateError as exc:
            raise self._template_failed(exc.what) from exc
        self._from_template(mp_connection.wait([template.process.sentinel], 0))
        if template.tainted:
            self._kill_workers()  # all idle, all forked from the tainted template
            self._close_template()
            self._start_workers()
        else:
            template.halt()

    def _kill_workers(self) -> None:
        """SIGKILL every worker and reap them (and the retired ones) against one bounded deadline."""
        workers, self._workers = self._workers, []
        _kill(workers)
        self._reap_retired(workers)

    def _close_template(self) -> None:
        template, self._template = self._template, None
        if template is not None:
            template.close(_REAP_TIMEOUT_S)

    def _replay_sample(self, batch: _Batch) -> list[tuple]:
        """Up to `warm_replay` of the batch's tasks that graded fast in an ordinary slot, spread through it."""
        fast = [
            batch.tasks[i]
            for i, outcome in enumerate(batch.outcomes)
            if outcome is not None and outcome.status == "ok" and not outcome.overflowed
        ]
        return fast[:: max(1, len(fast) // self.warm_replay)][: self.warm_replay]

    def _dispatch(self) -> None:
        """Hand pending tasks to idle workers, one each, oldest batch first."""
        idle = [w for w in self._workers if w.state == "idle" and w.role == "ordinary"]
        for batch in list(self._batches):
            while batch.pending and idle:
                worker, index = idle.pop(0), batch.pending[0]
                try:
                    worker.conn.send(batch.tasks[index])
                except (OSError, EOFError) as exc:
                    raise self._died(
                        worker, f"task pipe broke ({type(exc).__name__}: {exc}) sending task {index}"
                    ) from exc
                except Exception as exc:  # noqa: BLE001 - pickling failed before anything was written: the batch's error
                    error = GradingTaskError(
                        f"task {index} could not be sent to a worker: {type(exc).__name__}: {exc}",
                        task_index=index,
                        remote_type=type(exc).__name__,
                        remote_text=str(exc),
                    )
                    error.__cause__ = exc
                    idle.insert(0, worker)
                    self._abort_batch(batch, error)
                    break
                batch.pending.popleft()
                worker.state, worker.task_index, worker.batch = "busy", index, batch
                worker.since = time.monotonic()
                worker.soft_check_at = worker.since + self.soft_timeout_s  # CPU time cannot outrun wall time

    def _step(self, cap: float, label: str) -> None:
        """Wait once (pipes + sentinels + the wake pipe, until the nearest deadline), then act on what happened."""
        owners: dict[Any, _Worker] = {}
        for worker in self._workers:
            owners[worker.conn] = worker
            owners[worker.process.sentinel] = worker
        watched: list[Any] = [*owners, self._wake_r]
        if self._template is not None:
            watched += [self._template.conn, self._template.process.sentinel]
        timeout = max(0.0, self._nearest_deadline(cap) - time.monotonic())
        ready = mp_connection.wait(watched, timeout)
        if self._wake_r in ready:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        self._from_template(ready)  # first: a worker's exit status may be among its reports
        ready = [obj for obj in ready if obj in owners]
        for obj in ready:  # replies first: a result that made it counts
            worker = owners[obj]
            if obj is worker.conn and worker in self._workers:  # not retired meanwhile (its batch aborted)
                batch = worker.batch
                try:
                    self._receive(worker)
                except GradingTaskError as exc:
                    assert batch is not None  # a task error comes only from a busy worker
                    self._abort_batch(batch, exc)
        for obj in ready:
            worker = owners[obj]
            if obj is not worker.conn and worker in self._workers:  # not retired by its own reply
                self._exited(worker, "exited unexpectedly")
        self._expire(cap, label)

    def _nearest_deadline(self, cap: float) -> float:
        deadlines = [cap]
        can_move = self._overflowing() < self.overflow
        for worker in self._workers:
            if worker.state == "busy":
                deadlines.append(worker.deadline(self.timeout_s))
                if can_move and worker.role == "ordinary":
                    deadlines.append(worker.soft_check_at)
            elif worker.state == "starting":
                deadlines.append(worker.since + _STARTUP_TIMEOUT_S)
        if self.memory_budget_bytes is not None and any(self._held()):
            deadlines.append(self._budget_check_at)
        return min(deadlines)

    def _held(self) -> Iterator[_Worker]:
        """Tasks moved to overflow workers, running or stopped: they keep their memory either way."""
        return (w for w in self._workers if w.role == "overflow" and w.state == "busy")

    def _keep_to_budget(self, now: float) -> None:
        """Past the memory budget, the held tasks that grew the most are killed (outcome "budget") until
        the rest fit. A task's memory is its worker's growth over its resident size when it was ready
        (what the task allocated, or copied from the heap it shares with the forkserver): read from
        /proc/PID/stat in constant time (smaps would walk every page, 8 times every 50 ms). Stopped
        ones count: they keep their memory."""
        self._budget_check_at = now + _BUDGET_CHECK_S
        held = list(self._held())
        sizes = {worker: max(0, _usage(worker.pid)[0] - worker.start_rss) for worker in held}
        total, over = sum(sizes.values()), []
        for worker in sorted(held, key=lambda w: sizes[w], reverse=True):
            if self.memory_budget_bytes is None or total <= self.memory_budget_bytes:
                break
            over.append(worker)
            total -= sizes[worker]
        for worker in over:
            assert worker.batch is not None  # busy
            elapsed = now - worker.since
            worker.batch.outcomes[worker.task_index] = GradeOutcome("budget", None, elapsed, True)
            log.info(
                "grading task %d killed in overflow worker pid %d: held tasks past the pool's memory budget (%d MiB)",
                worker.task_index,
                worker.pid,
                (self.memory_budget_bytes or 0) >> 20,
            )
        if over:
            self._retire(*over)

    def _receive(self, worker: _Worker) -> None:
        """Read one message from a worker and update its state / its batch."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError) as exc:
            self._exited(worker, f"result pipe broke ({type(exc).__name__})")
            return
        kind = message[0]
        if kind == "ready" and worker.state == "starting":
            worker.state, worker.since = "idle", time.monotonic()
            worker.start_rss, worker.cpu_base = _usage(worker.pid)
            return
        if kind == "fatal":
            raise GradingPoolError(f"grading worker pid {worker.pid} cannot load {self.grade_fn!r}: {message[1]}")
        batch = worker.batch
        if worker.state != "busy" or batch is None:
            raise GradingPoolError(f"grading worker pid {worker.pid} sent {kind!r} {worker.doing()} (protocol error)")
        index, elapsed = worker.task_index, time.monotonic() - worker.since
        worker.state, worker.batch = "idle", None
        moved = worker.role == "overflow"
        if kind == "ok":
            batch.outcomes[index] = GradeOutcome("ok", message[1], elapsed, moved)
            if moved:
                self._retire(worker)  # an overflow worker served its one task
                return
            rss, worker.cpu_base = _usage(worker.pid)
            if rss > worker.start_rss + RECYCLE_GROWTH_BYTES:
                self._retire(worker)  # a grown worker gives its memory back
            return
        if kind == "memory":
            batch.outcomes[index] = GradeOutcome("memory", None, elapsed, moved)
            log.info("grading task %d passed the memory cap in worker pid %d (%s)", index, worker.pid, message[1])
            self._retire(worker)  # it exits after reporting
            return
        worker.cpu_base = _usage(worker.pid)[1]  # it stays, idle: its next task's CPU time starts here
        raise GradingTaskError(
            f"grade_fn {self.grade_fn!r} raised in worker pid {worker.pid} on task {index}: {message[2]}",
            task_index=index,
            remote_type=message[1],
            remote_text=message[2],
        )

    def _expire(self, cap: float, label: str) -> None:
        """Kill workers past their task timeout (replacing them); move tasks past the soft deadline
        to overflow; raise past the hard caps (a batch's, or `cap` for what `label` names)."""
        now = time.monotonic()
        expired: list[_Worker] = []
        for worker in list(self._workers):
            if worker.state == "busy" and now >= worker.deadline(self.timeout_s):
                expired.append(worker)
            elif (
                worker.state == "busy"
                and worker.role == "ordinary"
                and now >= worker.soft_check_at
                and self._overflowing() < self.overflow
                and self._past_soft_deadline(worker, now)
            ):
                self._overflow(worker)
            elif worker.state == "starting" and now >= worker.since + _STARTUP_TIMEOUT_S:
                raise GradingPoolError(f"grading worker pid {worker.pid} not ready after {_STARTUP_TIMEOUT_S:.0f}s")
        if expired:
            self._time_out(expired, now)
        if self.memory_budget_bytes is not None and now >= self._budget_check_at and any(self._held()):
            self._keep_to_budget(now)
        if self._batches:
            self._continue_overflow()
        late = next((b.label for b in self._batches if now >= b.deadline), label if now >= cap else None)
        if late is not None:
            raise GradingPoolError(
                f"{late} exceeded its deadline (timeout_s={self.timeout_s}, jobs={self.jobs}); "
                f"busy workers: {[(w.pid, w.task_index) for w in self._workers if w.state == 'busy']}"
            )

    def _time_out(self, workers: list[_Worker], now: float) -> None:
        """Record each task as timed out, then SIGKILL exactly their workers, together (the held-back
        slow tasks share one deadline); see _retire for when they are reaped."""
        for worker in workers:
            elapsed = now - worker.since
            assert worker.batch is not None  # busy
            worker.batch.outcomes[worker.task_index] = GradeOutcome("timeout", None, elapsed, worker.role == "overflow")
            log.info(
                "grading task %d timed out after %.1fs; killed worker pid %d", worker.task_index, elapsed, worker.pid
            )
        self._retire(*workers)

    def _past_soft_deadline(self, worker: _Worker, now: float) -> bool:
        """Has its task used the soft deadline in CPU time (or held its slot WAIT_FACTOR times that)?
        If not, when to look again: no sooner than it could have."""
        used = _usage(worker.pid)[1] - worker.cpu_base
        if used >= self.soft_timeout_s or now >= worker.since + WAIT_FACTOR * self.soft_timeout_s:
            return True
        next_check = now + max(self.soft_timeout_s - used, _CPU_TICK_S)
        worker.soft_check_at = min(next_check, worker.since + WAIT_FACTOR * self.soft_timeout_s)
        return False

    def _overflowing(self) -> int:
        return sum(worker.role == "overflow" for worker in self._workers)

    def _overflow(self, worker: _Worker) -> None:
        """The slow task leaves the `jobs` slots for later; the spare takes its slot now."""
        worker.role = "overflow"
        self._signal(worker, signal.SIGSTOP)
        worker.stopped_at = time.monotonic()
        log.info(
            "grading task %d passed the soft deadline: held in overflow worker pid %d", worker.task_index, worker.pid
        )
        spare = next((w for w in self._workers if w.role == "spare"), None)
        if spare is None:
            self._spawn()
            return
        spare.role = "ordinary"  # the slot is served now; the next spare forks meanwhile
        self._spawn("spare")

    def _continue_overflow(self) -> None:
        """Once no ordinary task of any batch is left to grade, the held-back slow tasks run (their clocks
        resume)."""
        if any(b.pending for b in self._batches) or any(
            w.state == "busy" and w.role == "ordinary" for w in self._workers
        ):
            return
        now = time.monotonic()
        for worker in self._workers:
            if worker.stopped_at is not None:
                worker.stopped_s += now - worker.stopped_at
                worker.stopped_at = None
                self._signal(worker, signal.SIGCONT)

    @staticmethod
    def _signal(worker: _Worker, signum: int) -> None:
        if isinstance(worker.process, CloneProcess):
            worker.process.send_signal(signum)  # through its pidfd
            return
        try:
            os.kill(worker.pid, signum)  # our child, not yet reaped (we reap only in _reap)
        except ProcessLookupError:
            pass  # it exited on its own: its sentinel reports that on the next wait

    def _retire(self, *workers: _Worker) -> None:
        """SIGKILL workers done with (or past) their tasks; an ordinary one is replaced. They are reaped
        later, together: waiting for each here would hold up the deadlines of the others (a dying worker
        with a large heap, on cores its busy neighbours keep, takes 0.1-0.3 s to exit)."""
        for worker in workers:
            self._workers.remove(worker)
        _kill(workers)
        self._retired.extend(workers)
        for worker in workers:
            if worker.role == "ordinary":
                self._spawn()

    def _reap_retired(self, also: Sequence[_Worker] = (), wait: bool = True) -> None:
        """Reap the retired workers (and `also`, already killed) against one shared deadline; without
        `wait`, only those already gone (the others stay retired, to be reaped later)."""
        workers = [*self._retired, *also]
        self._retired = _reap(workers, _REAP_TIMEOUT_S if wait else 0.0)

    def _exited(self, worker: _Worker, what: str) -> None:
        """A worker exited on its own: past its task's CPU-time cap is that task's outcome; anything
        else (a crash, a kill from outside) breaks the pool."""
        worker.process.join(_DEATH_STATUS_WAIT_S)
        batch = worker.batch
        if worker.state == "busy" and batch is not None and worker.process.exitcode == -signal.SIGXCPU:
            elapsed = time.monotonic() - worker.since
            batch.outcomes[worker.task_index] = GradeOutcome("cpu", None, elapsed, worker.role == "overflow")
            log.info("grading task %d passed its CPU-time cap in worker pid %d", worker.task_index, worker.pid)
            self._retire(worker)
            return
        raise self._died(worker, what)

    def _died(self, worker: _Worker, what: str) -> GradingPoolError:
        """Build the error for a worker that failed on its own; wait briefly for its exit status."""
        worker.process.join(_DEATH_STATUS_WAIT_S)
        return GradingPoolError(
            f"grading worker pid {worker.pid} {what} {worker.doing()}: {describe_exitcode(worker.process.exitcode)}"
        )

    def _fail(self, exc: BaseException) -> None:
        """Kill every worker (their state may be bad) and remember why the pool broke."""
        if self._broken is None:
            self._broken = (
                exc
                if isinstance(exc, GradingPoolError)
                else GradingPoolError(f"interrupted by {type(exc).__name__}: {exc}")
            )
        if self._state == "running":
            self._state = "broken"
        with self._intake:
            arriving, self._arriving = self._arriving, []
        for batch in [*self._batches, *arriving]:
            self._finish(batch, self._broken)
        self._kill_workers()
        self._close_template()


def _usage(pid: int) -> tuple[int, float]:
    """A worker's resident bytes and CPU seconds (user + system), from /proc; (0, 0.0) once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
    except (FileNotFoundError, ProcessLookupError):
        return 0, 0.0
    # fields[0] is the state (field 3 of proc(5)): utime, stime are fields 14, 15; rss (pages) field 24
    return int(fields[21]) * _PAGE_SIZE, (int(fields[11]) + int(fields[12])) * _CPU_TICK_S


def _kill(workers: Sequence[_Worker]) -> None:
    """SIGKILL each worker that is not yet known to be gone, and close our end of its pipe."""
    for worker in workers:
        worker.conn.close()
        try:
            if worker.process.exitcode is None:  # never signal a pid the forkserver already reaped
                worker.process.kill()
        except (OSError, ValueError):
            pass


def _reap(workers: Sequence[_Worker], budget_s: float) -> list[_Worker]:
    """Join each killed worker against one shared deadline; return those still running (logged
    unless the budget was 0: a poll)."""
    deadline = time.monotonic() + budget_s
    running = []
    for worker in workers:
        try:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                running.append(worker)
                if budget_s:
                    log.warning("grading worker pid %d alive %.1fs after SIGKILL; leaving it", worker.pid, budget_s)
            else:
                worker.process.close()
        except ValueError:  # already closed
            pass
    return running
