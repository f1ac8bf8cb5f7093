"""A forkserver process pool for CPU-bound grading with hard per-item timeouts.

Why not `multiprocessing.Pool`: its `terminate()` joins without a bound, a
worker stuck in C code can't be interrupted, and a timed-out task can't be
cancelled without losing the whole pool. Here (as in pebble) each worker runs
one task at a time over its own pipe, so a timed-out task costs exactly one
SIGKILLed worker; and (as in loky) the parent waits on result pipes *and*
worker sentinels, so a worker that dies is noticed at once, not at a timeout.

Workers fork from a forkserver that has already imported the heavy modules
(`preload`), so starting or replacing one costs a fork, not an import; what the preload
built is frozen (gc.freeze), so no worker's full collection walks it. multiprocessing keeps
one forkserver per process: `start()` launches it with the pool's preload before it returns
(a caller's later `set_forkserver_preload` cannot race it). Where the caller's own forkserver
already runs, preloading other modules, the workers fork from a template that imported the
pool's preload itself, so they grade as warm as ever, and the caller's forkserver is left alone.
With `warm_replay`, they fork instead from a template (a child of the forkserver) that replays some
of each batch's ordinary tasks once the batch is done, so a worker started mid-batch (a spare, a
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
growth since it was ready): past it, the largest are killed, outcome "budget". Each worker's address
space is capped (a task past `memory_cap_bytes` fails with MemoryError: outcome "memory", the worker
exits) and each task's CPU time is capped by the kernel (RLIMIT_CPU, outcome "cpu"), a backstop to
the timeout. A worker whose memory grew while grading is replaced, so the pool returns to its size
after a hostile batch.

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

The map. One grade() call, and the loop its driver runs (tasks.TaskManager._drive_until):

    grade(tasks) -> Batch --(drive lock free?)--> lead: run the loop   (else follow: wait for done)
      loop, until this caller's batch is done:
        _adopt       take batches other callers queued
        _dispatch    pending task -> idle ordinary worker, oldest batch first
        _step        one wait on result pipes + worker sentinels + the wake pipe, until the
                     nearest deadline; then: results -> outcomes, exits -> "crash" or broken
        _expire      deadlines: soft (CPU time) -> overflow; hard -> SIGKILL ("timeout");
                     the held tasks past the memory budget -> SIGKILL ("budget")
        _settle_batches  a batch whose every task has an outcome is done (its caller returns)

A worker's states (workers.Worker.state, and its role):

    spawn --> starting --Ready--> idle --task--> busy --result--> idle   (ordinary, or spare)
                  |                               |
                  | exits: pool broken            +-- soft deadline used --> overflow (role):
                                                  |      SIGSTOP while ordinary tasks remain,
                                                  |      SIGCONT after; a spare takes its slot
                                                  +-- hard deadline / budget / grew --> retired:
                                                         SIGKILL at once, reaped once gone

A task's outcome (outcomes.GradeOutcome.status) is one of ok | timeout | memory | cpu | budget;
a task that raised fails its batch (GradingTaskError), a worker that died otherwise breaks the
pool (GradingPoolError): never a silent score.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Sequence
from typing import Any

from scorers.grading.config import (
    DEFAULT_MEMORY_BUDGET_BYTES,
    DEFAULT_MEMORY_CAP_BYTES,
    PoolConfig,
    build_config,
)
from scorers.grading.errors import GradingPoolError
from scorers.grading.mp_helpers import (
    acquire_helpers,
    forkserver_modules,
    release_helpers,
    serving_forkserver,
)
from scorers.grading.outcomes import GradeOutcome
from scorers.grading.tasks import TaskManager
from scorers.grading.workers import REAP_TIMEOUT_S, WorkerManager

log = logging.getLogger(__name__)

_CLOSE_WAIT_S = 5.0  # how long close() waits for a grade() in flight to see the pool closed


class GradingPool:
    """Forkserver workers, one task each at a time, hard per-task timeouts.

    `grade_fn` is "module:function", importable in the child (our packages or extra_import_paths);
    it gets each task's tuple as positional args and returns a picklable result. A facade: the task
    manager (scorers/grading/tasks.py) drives the batches over the worker manager's workers
    (workers.py).
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
        """`soft_timeout_s`: None = min(0.1 s, timeout_s / 2). `overflow`: the most tasks moved out
        of the ordinary slots at once; None = max(16, 4 x jobs), 0 = never move one.
        `memory_cap_bytes`: None = no cap. `warm_replay`: workers fork from a template that replays
        up to this many of each batch's ordinary tasks once the batch is done (grade_fn must be free
        of side effects); 0 = they fork from the forkserver."""
        self.config: PoolConfig = build_config(
            jobs, timeout_s, grade_fn, preload, soft_timeout_s, overflow, memory_cap_bytes,
            warm_replay, memory_budget_bytes,
        )  # fmt: skip
        self._ctx = multiprocessing.get_context("forkserver")
        self._workers = WorkerManager(self.config, self._ctx)
        self._tasks = TaskManager(self.config, self._workers)
        self._holds_helpers = False
        self._starter: threading.Thread | None = None

    # the options, with their defaults applied
    jobs = property(lambda self: self.config.jobs)
    timeout_s = property(lambda self: self.config.timeout_s)
    soft_timeout_s = property(lambda self: self.config.soft_timeout_s)
    overflow = property(lambda self: self.config.overflow)
    memory_cap_bytes = property(lambda self: self.config.memory_cap_bytes)
    memory_budget_bytes = property(lambda self: self.config.memory_budget_bytes)
    grade_fn = property(lambda self: self.config.grade_fn)
    preload = property(lambda self: self.config.preload)
    warm_replay = property(lambda self: self.config.warm_replay)

    def start(self, wait: bool = True) -> None:
        """Start the workers and wait (bounded) until each has loaded grade_fn.

        `wait=False`: they start in a thread that holds the drive lock, and this returns at once.
        The first grade() waits for them (its hard cap counts from its call) and raises the start's
        failure as its own; close() waits (bounded) for the start to end. A managed child says it is
        ready meanwhile, so the forkserver's preload and warm-up overlap the trainer's own start."""
        if self._tasks.state != "new":
            raise GradingPoolError(
                f"GradingPool.start() called twice (pool is {self._tasks.state})"
            )
        self._tasks.state = "running"
        acquire_helpers()
        self._holds_helpers = True
        # here, not in the thread: the forkserver that will fork the workers is settled before
        # start() returns
        modules = forkserver_modules(self.config.preload, self.config.grade_fn)
        self._workers.server_preloads = serving_forkserver(modules)
        if wait:
            self._start_workers()
            return
        # taken here, so that no grade() can drive before the workers exist
        self._tasks.drive.acquire()
        self._starter = threading.Thread(
            target=self._start_in_background, name="grading-pool-start", daemon=True
        )
        try:
            self._starter.start()
        except BaseException:
            self._tasks.drive.release()
            raise

    def _start_workers(self) -> None:
        try:
            self._workers.start()
        except BaseException as exc:
            self._tasks.fail(exc)
            raise

    def _start_in_background(self) -> None:
        """The workers' start, holding the drive lock start() took; a failure breaks the pool (its
        error is the next grade()'s). A close() that gave up waiting has killed what it saw: what
        this started afterwards is killed here."""
        try:
            self._start_workers()
        except BaseException as exc:  # noqa: BLE001 - remembered as the pool's broken_error, raised by grade()
            log.warning("grading pool: the workers' start failed: %s", exc)
        finally:
            if self._tasks.state == "closed":
                self._workers.kill_all()
                self._workers.close_template()
            self._tasks.drive.release()

    def grade(self, tasks: Sequence[tuple]) -> list[GradeOutcome]:
        """Grade every task; "timeout" outcomes for tasks past timeout_s; raise on failure. Several
        threads may grade at once: their batches share the workers (see the module docstring)."""
        self._check_usable()
        checked = _checked_tasks(tasks)
        return self._tasks.grade(checked) if checked else []

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Wait (bounded) until the template has replayed the last batch; True if it has (or there
        is none). A trainer never needs this (the replay runs while it generates); a benchmark does,
        to time batches on an otherwise idle machine. False if the workers' start (or a grade())
        holds the pool past `timeout_s`; a start that failed meanwhile raises, as grade() would."""
        self._check_usable()
        timeout_s = max(0.0, timeout_s)  # a lock's timeout of -1 would mean none
        deadline = time.monotonic() + timeout_s
        if not self._tasks.drive.acquire(timeout=timeout_s):
            return False
        try:
            self._check_usable()
            return self._workers.settle_template(max(0.0, deadline - time.monotonic()))
        finally:
            self._tasks.drive.release()

    @property
    def starting(self) -> bool:
        """The workers' start (`start(wait=False)`) is still running: the first grade() will wait
        for it."""
        return self._starter is not None and self._starter.is_alive()

    def wait_started(self, timeout_s: float) -> None:
        """Wait (bounded) until the workers' start has ended, up or failed (grade() raises the
        failure)."""
        if self._starter is not None:
            self._starter.join(timeout_s)

    def batch_cap_s(self, n_tasks: int) -> float:
        """Hard cap on one grade() call: every round of tasks may take 3x its timeout."""
        return self._tasks.batch_cap_s(n_tasks)

    @property
    def broken(self) -> bool:
        """A worker or IPC failure (or the batch cap) broke the pool; only a new pool can grade."""
        return self._tasks.state == "broken"

    def worker_pids(self) -> list[int]:
        """Pids of the workers holding or waiting on tasks, not the spare (for tests and
        diagnostics)."""
        return [w.pid for w in self._workers.workers if w.role != "spare"]

    def spare_pids(self) -> list[int]:
        return [w.pid for w in self._workers.workers if w.role == "spare"]

    def template_pid(self) -> int | None:
        """The process workers fork from when `warm_replay` is on (None: they fork from the
        forkserver)."""
        template = self._workers.template
        return None if template is None else template.pid

    def close(self) -> None:
        """SIGKILL and reap every worker; the last pool also stops the helpers. Bounded,
        idempotent."""
        if self._tasks.state == "closed":
            return
        self._tasks.state = "closed"
        # a grade() in flight sees the pool closed at its next look, and lets go of it
        self._tasks.wake()
        driving = self._tasks.drive.acquire(timeout=_CLOSE_WAIT_S)
        try:
            if not driving:
                log.warning(
                    "grading pool: a grade() or the workers' start still runs after %.0f s; "
                    "closing under it",
                    _CLOSE_WAIT_S,
                )
            self._workers.kill_all()
            self._workers.close_template()
            self._tasks.close_wake_pipe()
        finally:
            if driving:
                self._tasks.drive.release()
        if self._holds_helpers:
            self._holds_helpers = False
            release_helpers(REAP_TIMEOUT_S)

    def __enter__(self) -> GradingPool:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _check_usable(self) -> None:
        """Refuse to grade unless running; a broken pool repeats its original cause."""
        state = self._tasks.state
        if state == "running":
            return
        if state == "broken":
            raise GradingPoolError(
                f"grading pool is broken: {self._tasks.broken_error}"
            ) from self._tasks.broken_error
        raise GradingPoolError(
            "grading pool is not started" if state == "new" else "grading pool is closed"
        )


def _checked_tasks(tasks: Sequence[tuple]) -> list[tuple]:
    """The tasks as a list, each checked to be a tuple of args."""
    checked = list(tasks)
    for index, task in enumerate(checked):
        if not isinstance(task, tuple):
            raise TypeError(f"tasks[{index}] must be a tuple of args, got {type(task).__name__}")
    return checked
