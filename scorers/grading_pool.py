"""A forkserver process pool for CPU-bound grading with hard per-item timeouts.

Why not `multiprocessing.Pool`: its `terminate()` joins without a bound, a
worker stuck in C code can't be interrupted, and a timed-out task can't be
cancelled without losing the whole pool. Here (as in pebble) each worker runs
one task at a time over its own pipe, so a timed-out task costs exactly one
SIGKILLed worker; and (as in loky) the parent waits on result pipes *and*
worker sentinels, so a worker that dies is noticed at once, not at a timeout.

Workers fork from a forkserver that has already imported the heavy modules
(`preload`), so starting or replacing one costs a fork, not an import.

Liveness chain: the owner holds the forkserver's "alive" pipe; workers drop
their inherited copy of it, so when the owner dies the forkserver sees EOF and
exits, and every worker dies with it through PR_SET_PDEATHSIG -- even one stuck
in C code.

Not thread-safe: call `grade()` and `close()` from one thread.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from typing import Any

from child_runtime.exit_codes import describe
from scorers.grading_worker import ORPHANED_EXIT_CODE, worker_main
from scorers.mp_helpers import acquire_helpers, forkserver_pid, release_helpers

log = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 60.0
_REAP_TIMEOUT_S = 2.0
_DEATH_STATUS_WAIT_S = 1.0


class GradingPoolError(RuntimeError):
    """The pool cannot give a trustworthy outcome (worker death, IPC failure, batch cap)."""


class GradingTaskError(GradingPoolError):
    """`grade_fn` raised for one task; the batch is aborted but the pool stays usable.

    Kept distinct so a caller can turn a bad input (e.g. an unparsable gold
    answer) into a 4xx instead of tearing the pool down.
    """

    def __init__(self, message: str, *, task_index: int, remote_type: str, remote_text: str) -> None:
        super().__init__(message)
        self.task_index = task_index
        self.remote_type = remote_type
        self.remote_text = remote_text


@dataclass(frozen=True)
class GradeOutcome:
    """One task's outcome: `value` is grade_fn's result when status is "ok", else None."""

    status: str  # "ok" | "timeout"
    value: Any
    elapsed_s: float


@dataclass(eq=False)
class _Worker:
    """Owner-side record of one worker: its process, pipe, and what it is doing."""

    process: Any
    conn: Any
    pid: int  # cached: a closed Process object no longer tells its pid
    since: float
    state: str = "starting"  # starting | idle | busy
    task_index: int = -1

    def doing(self) -> str:
        if self.state == "busy":
            return f"while grading task {self.task_index}"
        return "while starting" if self.state == "starting" else "while idle"


@dataclass
class _Batch:
    """One grade() call in flight."""

    tasks: list[tuple]
    deadline: float
    outcomes: list[GradeOutcome | None]
    pending: deque[int] = field(default_factory=deque)


_WORKER_EXIT_MEANINGS = {
    255: "or the forkserver itself died",
    ORPHANED_EXIT_CODE: "forkserver gone before the worker started",
}


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
    ) -> None:
        if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
            raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise TypeError(f"timeout_s must be a number, got {type(timeout_s).__name__}")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be finite and > 0, got {timeout_s!r}")
        module_name, sep, attr = grade_fn.partition(":") if isinstance(grade_fn, str) else ("", "", "")
        if not (module_name and sep and attr):
            raise ValueError(f"grade_fn must be 'module:function', got {grade_fn!r}")
        if isinstance(preload, str) or not all(isinstance(m, str) and m for m in preload):
            raise TypeError(f"preload must be a sequence of module names, got {preload!r}")
        self.jobs = jobs
        self.timeout_s = float(timeout_s)
        self.grade_fn = grade_fn
        self.preload = tuple(preload)
        self._batch_slack_s = 60.0
        self._ctx = multiprocessing.get_context("forkserver")
        self._workers: list[_Worker] = []
        self._state = "new"  # new | running | broken | closed
        self._broken: GradingPoolError | None = None
        self._holds_helpers = False

    # ---------------------------------------------------------------- public

    def start(self) -> None:
        """Start the workers and wait (bounded) until each has loaded grade_fn."""
        if self._state != "new":
            raise GradingPoolError(f"GradingPool.start() called twice (pool is {self._state})")
        self._state = "running"
        acquire_helpers()
        self._holds_helpers = True
        modules = [*self.preload, self.grade_fn.partition(":")[0]]
        # Only effective if this process's forkserver is not running yet (process-global).
        self._ctx.set_forkserver_preload(list(dict.fromkeys(modules)))
        try:
            for _ in range(self.jobs):
                self._spawn()
            deadline = time.monotonic() + _STARTUP_TIMEOUT_S
            while any(w.state == "starting" for w in self._workers):
                self._step(None, deadline, "worker startup")
        except BaseException as exc:
            self._fail(exc)
            raise

    def grade(self, tasks: Sequence[tuple]) -> list[GradeOutcome]:
        """Grade every task; "timeout" outcomes for tasks past timeout_s; raise on failure."""
        self._check_usable()
        tasks = list(tasks)
        for index, task in enumerate(tasks):
            if not isinstance(task, tuple):
                raise TypeError(f"tasks[{index}] must be a tuple of args, got {type(task).__name__}")
        if not tasks:
            return []
        cap_s = self.batch_cap_s(len(tasks))
        batch = _Batch(tasks, time.monotonic() + cap_s, [None] * len(tasks), deque(range(len(tasks))))
        label = f"batch of {len(tasks)} tasks (hard cap {cap_s:.0f}s)"
        try:
            while batch.pending or any(w.state == "busy" for w in self._workers):
                self._dispatch(batch)
                self._step(batch, batch.deadline, label)
        except GradingTaskError:
            self._abort_in_flight()
            raise
        except BaseException as exc:
            self._fail(exc)
            raise
        return list(batch.outcomes)  # type: ignore[arg-type]

    def batch_cap_s(self, n_tasks: int) -> float:
        """Hard cap on one grade() call: every round of tasks may take 3x its timeout."""
        return 3 * self.timeout_s * math.ceil(n_tasks / self.jobs) + self._batch_slack_s

    @property
    def broken(self) -> bool:
        """A worker or IPC failure (or the batch cap) broke the pool; only a new pool can grade."""
        return self._state == "broken"

    def worker_pids(self) -> list[int]:
        """Pids of the current workers (for tests and diagnostics)."""
        return [w.pid for w in self._workers]

    def close(self) -> None:
        """SIGKILL and reap every worker; the last pool also stops the helpers. Bounded, idempotent."""
        if self._state == "closed":
            return
        self._state = "closed"
        workers, self._workers = self._workers, []
        _kill_and_reap(workers, _REAP_TIMEOUT_S)
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

    def _spawn(self) -> _Worker:
        """Start one worker with its own duplex pipe; the owner keeps one end only."""
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main,
            args=(child_conn, self.grade_fn, forkserver_pid()),
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
        worker = _Worker(process, parent_conn, process.pid, since=time.monotonic())
        self._workers.append(worker)
        return worker

    def _dispatch(self, batch: _Batch) -> None:
        """Hand pending tasks to idle workers, one each."""
        for worker in self._workers:
            if not batch.pending:
                return
            if worker.state != "idle":
                continue
            index = batch.pending[0]
            try:
                worker.conn.send(batch.tasks[index])
            except (OSError, EOFError) as exc:
                raise self._died(worker, f"task pipe broke ({type(exc).__name__}: {exc}) sending task {index}") from exc
            except Exception as exc:  # pickling failed before anything was written
                raise GradingTaskError(
                    f"task {index} could not be sent to a worker: {type(exc).__name__}: {exc}",
                    task_index=index,
                    remote_type=type(exc).__name__,
                    remote_text=str(exc),
                ) from exc
            batch.pending.popleft()
            worker.state, worker.task_index, worker.since = "busy", index, time.monotonic()

    def _step(self, batch: _Batch | None, deadline: float, label: str) -> None:
        """Wait once (pipes + sentinels, until the nearest deadline), then act on what happened."""
        owners: dict[Any, _Worker] = {}
        for worker in self._workers:
            owners[worker.conn] = worker
            owners[worker.process.sentinel] = worker
        timeout = max(0.0, self._nearest_deadline(deadline) - time.monotonic())
        ready = mp_connection.wait(list(owners), timeout)
        for obj in ready:  # replies first: a result that made it counts
            if obj is owners[obj].conn:
                self._receive(owners[obj], batch)
        for obj in ready:
            if obj is not owners[obj].conn:
                raise self._died(owners[obj], "exited unexpectedly")
        self._expire(batch, deadline, label)

    def _nearest_deadline(self, cap: float) -> float:
        deadlines = [cap]
        for worker in self._workers:
            if worker.state == "busy":
                deadlines.append(worker.since + self.timeout_s)
            elif worker.state == "starting":
                deadlines.append(worker.since + _STARTUP_TIMEOUT_S)
        return min(deadlines)

    def _receive(self, worker: _Worker, batch: _Batch | None) -> None:
        """Read one message from a worker and update its state / the batch."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError) as exc:
            raise self._died(worker, f"result pipe broke ({type(exc).__name__})") from exc
        kind = message[0]
        if kind == "ready" and worker.state == "starting":
            worker.state, worker.since = "idle", time.monotonic()
            return
        if kind == "fatal":
            raise GradingPoolError(f"grading worker pid {worker.pid} cannot load {self.grade_fn!r}: {message[1]}")
        if worker.state != "busy" or batch is None:
            raise GradingPoolError(f"grading worker pid {worker.pid} sent {kind!r} {worker.doing()} (protocol error)")
        index, elapsed = worker.task_index, time.monotonic() - worker.since
        worker.state = "idle"
        if kind == "ok":
            batch.outcomes[index] = GradeOutcome("ok", message[1], elapsed)
            return
        raise GradingTaskError(
            f"grade_fn {self.grade_fn!r} raised in worker pid {worker.pid} on task {index}: {message[2]}",
            task_index=index,
            remote_type=message[1],
            remote_text=message[2],
        )

    def _expire(self, batch: _Batch | None, deadline: float, label: str) -> None:
        """Kill workers past their task timeout (replacing them); raise past the hard caps."""
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.state == "busy" and batch is not None and now >= worker.since + self.timeout_s:
                self._time_out(worker, batch, now)
            elif worker.state == "starting" and now >= worker.since + _STARTUP_TIMEOUT_S:
                raise GradingPoolError(f"grading worker pid {worker.pid} not ready after {_STARTUP_TIMEOUT_S:.0f}s")
        if now >= deadline:
            raise GradingPoolError(
                f"{label} exceeded its deadline (timeout_s={self.timeout_s}, jobs={self.jobs}); "
                f"busy workers: {[(w.pid, w.task_index) for w in self._workers if w.state == 'busy']}"
            )

    def _time_out(self, worker: _Worker, batch: _Batch, now: float) -> None:
        """Record the task as timed out, SIGKILL and reap exactly its worker, start a replacement."""
        self._workers.remove(worker)
        _kill_and_reap([worker], _REAP_TIMEOUT_S)
        batch.outcomes[worker.task_index] = GradeOutcome("timeout", None, now - worker.since)
        log.info(
            "grading task %d timed out after %.1fs; killed worker pid %d",
            worker.task_index,
            now - worker.since,
            worker.pid,
        )
        self._spawn()

    def _died(self, worker: _Worker, what: str) -> GradingPoolError:
        """Build the error for a worker that failed on its own; wait briefly for its exit status."""
        worker.process.join(_DEATH_STATUS_WAIT_S)
        return GradingPoolError(
            f"grading worker pid {worker.pid} {what} {worker.doing()}: {describe_exitcode(worker.process.exitcode)}"
        )

    def _abort_in_flight(self) -> None:
        """After a task error: replace busy workers (their replies would leak into the next batch)."""
        busy = [w for w in self._workers if w.state == "busy"]
        try:
            for worker in busy:
                self._workers.remove(worker)
            _kill_and_reap(busy, _REAP_TIMEOUT_S)
            for _ in busy:
                self._spawn()
        except BaseException as exc:
            self._fail(exc)
            raise

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
        workers, self._workers = self._workers, []
        _kill_and_reap(workers, _REAP_TIMEOUT_S)


def _kill_and_reap(workers: Sequence[_Worker], budget_s: float) -> None:
    """SIGKILL each worker, then join each against one shared deadline; log any survivor."""
    for worker in workers:
        worker.conn.close()
        try:
            if worker.process.exitcode is None:  # never signal a pid the forkserver already reaped
                worker.process.kill()
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + budget_s
    for worker in workers:
        try:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.exitcode is None:
                log.warning("grading worker pid %d still alive %.1fs after SIGKILL; leaving it", worker.pid, budget_s)
            else:
                worker.process.close()
        except ValueError:  # already closed
            pass
