"""The grading pool's task manager: the batches in flight, who drives them, and every deadline of
their tasks.

Why apart from the worker manager: this is the scheduling (which task goes to which idle worker,
when a task leaves its slot for overflow, when it has timed out, when a batch is settled, which held
tasks the memory budget kills), and the one event loop. Several threads may call grade() at once:
whichever holds the drive lock runs the loop for every batch in flight and hands it on when its own
batch is done (leader/follower), so the pool's state is only ever touched by one thread; a caller
whose batch the driver finished returns at once. Batches hand themselves in under the intake lock
and wake the driver through a pipe.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections import deque
from multiprocessing import connection as mp_connection
from typing import Any

from scorers.grading.config import WAIT_FACTOR, PoolConfig
from scorers.grading.errors import GradingPoolError, GradingTaskError
from scorers.grading.messages import Graded, OverMemory, Raised, Task
from scorers.grading.outcomes import Batch, GradeOutcome
from scorers.grading.workers import (
    CPU_TICK_S,
    RECYCLE_GROWTH_BYTES,
    STARTUP_TIMEOUT_S,
    Worker,
    WorkerManager,
    usage,
)

log = logging.getLogger(__name__)

# past a batch's hard cap, how long its caller waits for the thread driving the pool
_DRIVE_SLACK_S = 30.0
_HANDOFF_S = 0.02  # how often a caller that does not drive looks whether the drive lock came free
_BUDGET_CHECK_S = 0.05  # how often the held tasks' memory is read while there are any


class TaskManager:
    """The queue of batches and the loop that drives them over one WorkerManager's workers."""

    def __init__(self, config: PoolConfig, workers: WorkerManager) -> None:
        self.config = config
        self.workers = workers
        self.state = "new"  # new | running | broken | closed
        self.broken_error: GradingPoolError | None = None
        self.batch_slack_s = 60.0
        # in flight, oldest first (touched only by the drive lock's holder)
        self._batches: list[Batch] = []
        self._arriving: list[Batch] = []  # handed in by grade() callers, adopted by the driver
        self._intake = threading.Lock()  # guards _arriving and the wake pipe's numbers
        self.drive = threading.Lock()  # its holder runs the event loop for every batch
        self._sample: list[tuple] = []  # what the template replays once the pool is idle
        self._budget_check_at = 0.0
        self._wake_r, self._wake_w = os.pipe()  # a batch handed in wakes the driver's wait
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def batch_cap_s(self, n_tasks: int) -> float:
        """Hard cap on one grade() call: every round of tasks may take 3x its timeout."""
        return (
            3 * self.config.timeout_s * math.ceil(n_tasks / self.config.jobs) + self.batch_slack_s
        )

    # -- the callers' side -------------------------------------------------------------------------

    def grade(self, tasks: list[tuple]) -> list[GradeOutcome]:
        """Hand in one batch and wait for it, driving the pool while no other caller does."""
        cap_s = self.batch_cap_s(len(tasks))
        label = f"batch of {len(tasks)} tasks (hard cap {cap_s:.0f}s)"
        batch = Batch(
            tasks, time.monotonic() + cap_s, label, [None] * len(tasks), deque(range(len(tasks)))
        )
        with self._intake:
            self._arriving.append(batch)
        self.wake()
        try:
            self._lead_or_follow(batch)
        except BaseException:
            # another thread drives: it drops the batch at its next look
            if not batch.done.is_set():
                batch.cancelled = True
                self.wake()
            raise
        if batch.error is not None:
            raise batch.error
        return list(batch.outcomes)  # type: ignore[arg-type]

    def _lead_or_follow(self, batch: Batch) -> None:
        """Drive while the drive lock is free; else wait for the driver to finish `batch` or hand
        the loop on."""
        while not batch.done.is_set():
            if self.drive.acquire(blocking=False):
                try:
                    self._drive_until(batch)
                finally:
                    self.drive.release()
                continue
            # another caller drives: it finishes this batch too (set at once), or hands the loop on
            # when its own is done (taken here within _HANDOFF_S)
            if (
                not batch.done.wait(_HANDOFF_S)
                and time.monotonic() > batch.deadline + _DRIVE_SLACK_S
            ):
                raise GradingPoolError(
                    f"{batch.label}: unfinished at its hard cap, and the pool's driver is stuck"
                )

    def wake(self) -> None:
        # never a write to a closed pipe's number, which another file may have taken
        with self._intake:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # already awake: the pipe is full
                pass

    def close_wake_pipe(self) -> None:
        with self._intake:
            fds, (self._wake_r, self._wake_w) = (self._wake_r, self._wake_w), (-1, -1)
        for fd in fds:
            os.close(fd)

    # -- the driver's loop -------------------------------------------------------------------------

    def _drive_until(self, batch: Batch) -> None:
        """The event loop for every batch in flight, until `batch` is done. Holds the drive lock."""
        try:
            while True:
                self._adopt()
                if batch.done.is_set():
                    return
                # closed under us (or a bug): never spin
                if self.state != "running" or not self._batches:
                    for pending in [*self._batches, batch]:
                        self._finish(
                            pending,
                            self.broken_error or GradingPoolError("grading pool was closed"),
                        )
                    return
                self._dispatch()
                self._step(min(b.deadline for b in self._batches), "grading")
                self._settle_batches()
        except BaseException as exc:
            self.fail(exc)  # every batch in flight fails with the pool
            raise

    def _adopt(self) -> None:
        """Take in the batches handed over since the last look; drop those their callers gave up
        on."""
        with self._intake:
            arriving, self._arriving = self._arriving, []
        if self.state != "running":
            for batch in arriving:
                self._finish(batch, self.broken_error or GradingPoolError("grading pool is closed"))
            return
        was_idle = not self._batches
        now = time.monotonic()
        # in the list at once: a failure below (the template) fails them with the rest
        for batch in arriving:
            # its hard cap counts the work queued ahead of it: it shares the workers with the other
            # batches
            ahead = sum(len(b.pending) for b in self._batches) + len(self.workers.busy())
            batch.deadline = now + self.batch_cap_s(ahead + len(batch.tasks))
            self._batches.append(batch)
        # the pool was idle: its last killed workers go, the template stops
        if arriving and was_idle:
            self.workers.reap_retired()
            self.workers.between_batches()
        for batch in [b for b in self._batches if b.cancelled]:
            self._abort_batch(batch, GradingPoolError(f"{batch.label}: its caller gave up"))

    def _settle_batches(self) -> None:
        """Hand back each batch with nothing left to grade; once none is left, the template
        replays."""
        busy_batches = {id(w.batch) for w in self.workers.busy()}
        finished = [b for b in self._batches if not b.pending and id(b) not in busy_batches]
        for batch in finished:
            if self.workers.template is not None and self.config.warm_replay:
                self._sample = self._replay_sample(batch)
            self._finish(batch)
        if finished and not self._batches:
            # a killed worker with a large heap takes 0.1 s to exit
            self.workers.reap_retired(wait=False)
            with self._intake:
                idle = not self._arriving
            if idle and self._sample:
                self.workers.warm(self._sample)
                self._sample = []

    def _replay_sample(self, batch: Batch) -> list[tuple]:
        """Up to `warm_replay` of the batch's tasks that graded fast in an ordinary slot, spread
        through it."""
        fast = [
            batch.tasks[i]
            for i, outcome in enumerate(batch.outcomes)
            if outcome is not None and outcome.status == "ok" and not outcome.overflowed
        ]
        warm_replay = self.config.warm_replay
        return fast[:: max(1, len(fast) // warm_replay)][:warm_replay]

    def _finish(self, batch: Batch, error: BaseException | None = None) -> None:
        if batch in self._batches:
            self._batches.remove(batch)
        if error is not None:
            batch.pending.clear()
            batch.error = error
        batch.done.set()

    def _abort_batch(self, batch: Batch, error: BaseException) -> None:
        """One batch fails (a task raised, its caller gave up): its workers in flight are replaced
        (their replies would be read as another task's), the other batches go on."""
        self.workers.retire(*[w for w in self.workers.busy() if w.batch is batch])
        self._finish(batch, error)

    def fail(self, exc: BaseException) -> None:
        """Kill every worker (their state may be bad) and remember why the pool broke."""
        if self.broken_error is None:
            self.broken_error = (
                exc
                if isinstance(exc, GradingPoolError)
                else GradingPoolError(f"interrupted by {type(exc).__name__}: {exc}")
            )
        if self.state == "running":
            self.state = "broken"
        with self._intake:
            arriving, self._arriving = self._arriving, []
        for batch in [*self._batches, *arriving]:
            self._finish(batch, self.broken_error)
        self.workers.kill_all()
        self.workers.close_template()

    # -- handing out tasks -------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hand pending tasks to idle workers, one each, oldest batch first."""
        idle = self.workers.idle_ordinary()
        for batch in list(self._batches):
            while batch.pending and idle:
                worker, index = idle.pop(0), batch.pending[0]
                if not self._send(worker, batch, index):
                    idle.insert(0, worker)
                    break
                batch.pending.popleft()
                worker.state, worker.task_index, worker.batch = "busy", index, batch
                worker.since = time.monotonic()
                # CPU time cannot outrun wall time
                worker.soft_check_at = worker.since + self.config.soft_timeout_s

    def _send(self, worker: Worker, batch: Batch, index: int) -> bool:
        """Send one task; False (its batch aborted) if it would not pickle; raise if the pipe
        broke."""
        try:
            worker.conn.send(Task(batch.tasks[index]))
        except (OSError, EOFError) as exc:
            raise self.workers.died(
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
            self._abort_batch(batch, error)
            return False
        return True

    # -- one wait and what it brought --------------------------------------------------------------

    def _step(self, cap: float, label: str) -> None:
        """Wait once (pipes + sentinels + the wake pipe, until the nearest deadline), then act on
        what happened."""
        owners: dict[Any, Worker] = {}
        for worker in self.workers.workers:
            owners[worker.conn] = worker
            owners[worker.process.sentinel] = worker
        timeout = max(0.0, self._nearest_deadline(cap) - time.monotonic())
        ready = mp_connection.wait([*self.workers.watched(), self._wake_r], timeout)
        if self._wake_r in ready:
            self._drain_wake_pipe()
        self.workers.from_template(ready)  # first: a worker's exit status may be among its reports
        ready = [obj for obj in ready if obj in owners]
        for obj in ready:  # replies first: a result that made it counts
            worker = owners[obj]
            # not retired meanwhile (its batch aborted)
            if obj is worker.conn and worker in self.workers.workers:
                batch = worker.batch
                try:
                    self._receive(worker)
                except GradingTaskError as exc:
                    assert batch is not None  # a task error comes only from a busy worker
                    self._abort_batch(batch, exc)
        for obj in ready:
            worker = owners[obj]
            # not retired by its own reply
            if obj is not worker.conn and worker in self.workers.workers:
                self._exited(worker, "exited unexpectedly")
        self._expire(cap, label)

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _nearest_deadline(self, cap: float) -> float:
        deadlines = [cap]
        can_move = self.workers.overflowing() < self.config.overflow
        for worker in self.workers.workers:
            if worker.state == "busy":
                deadlines.append(worker.deadline(self.config.timeout_s))
                if can_move and worker.role == "ordinary":
                    deadlines.append(worker.soft_check_at)
            elif worker.state == "starting":
                deadlines.append(worker.since + STARTUP_TIMEOUT_S)
        if self.config.memory_budget_bytes is not None and any(self.workers.held()):
            deadlines.append(self._budget_check_at)
        return min(deadlines)

    def _receive(self, worker: Worker) -> None:
        """Read one message from a worker and update its state / its batch."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError) as exc:
            self._exited(worker, f"result pipe broke ({type(exc).__name__})")
            return
        if self.workers.greeted(worker, message):
            return
        batch = worker.batch
        if (
            worker.state != "busy"
            or batch is None
            or not isinstance(message, (Graded, OverMemory, Raised))
        ):
            raise self.workers.protocol_error(worker, message)
        index, elapsed = worker.task_index, time.monotonic() - worker.since
        worker.state, worker.batch = "idle", None
        moved = worker.role == "overflow"
        if isinstance(message, Graded):
            batch.outcomes[index] = GradeOutcome("ok", message.value, elapsed, moved)
            self._after_graded(worker)
        elif isinstance(message, OverMemory):
            batch.outcomes[index] = GradeOutcome("memory", None, elapsed, moved)
            log.info(
                "grading task %d passed the memory cap in worker pid %d (%s)",
                index,
                worker.pid,
                message.text,
            )
            self.workers.retire(worker)  # it exits after reporting
        else:
            # it stays, idle: its next task's CPU time starts here
            worker.cpu_base = usage(worker.pid)[1]
            raise GradingTaskError(
                f"grade_fn {self.config.grade_fn!r} raised in worker pid {worker.pid} on "
                f"task {index}: {message.remote_text}",
                task_index=index,
                remote_type=message.remote_type,
                remote_text=message.remote_text,
            )

    def _after_graded(self, worker: Worker) -> None:
        """An overflow worker served its one task; a grown worker gives its memory back; others
        stay."""
        if worker.role == "overflow":
            self.workers.retire(worker)
            return
        rss, worker.cpu_base = usage(worker.pid)
        if rss > worker.start_rss + RECYCLE_GROWTH_BYTES:
            self.workers.retire(worker)

    def _exited(self, worker: Worker, what: str) -> None:
        """A worker exited on its own: past its task's CPU-time cap is that task's outcome; anything
        else (a crash, a kill from outside) breaks the pool."""
        code = self.workers.exit_status(worker)
        batch = worker.batch
        if worker.state == "busy" and batch is not None and code == -signal.SIGXCPU:
            elapsed = time.monotonic() - worker.since
            batch.outcomes[worker.task_index] = GradeOutcome(
                "cpu", None, elapsed, worker.role == "overflow"
            )
            log.info(
                "grading task %d passed its CPU-time cap in worker pid %d",
                worker.task_index,
                worker.pid,
            )
            self.workers.retire(worker)
            return
        raise self.workers.died(worker, what)

    # -- deadlines ---------------------------------------------------------------------------------

    def _expire(self, cap: float, label: str) -> None:
        """Kill workers past their task timeout (replacing them); move tasks past the soft deadline
        to overflow; raise past the hard caps (a batch's, or `cap` for what `label` names)."""
        now = time.monotonic()
        expired = self._scan_workers(now)
        if expired:
            self._time_out(expired, now)
        if (
            self.config.memory_budget_bytes is not None
            and now >= self._budget_check_at
            and any(self.workers.held())
        ):
            self._keep_to_budget(now, self.config.memory_budget_bytes)
        if self._batches:
            self._continue_overflow()
        late = next(
            (b.label for b in self._batches if now >= b.deadline), label if now >= cap else None
        )
        if late is not None:
            raise GradingPoolError(
                f"{late} exceeded its deadline (timeout_s={self.config.timeout_s}, "
                f"jobs={self.config.jobs}); busy workers: "
                f"{[(w.pid, w.task_index) for w in self.workers.busy()]}"
            )

    def _scan_workers(self, now: float) -> list[Worker]:
        """The workers past their task's timeout; meanwhile move tasks past the soft deadline, and
        raise for a worker past its startup timeout."""
        expired: list[Worker] = []
        for worker in list(self.workers.workers):
            if worker.state == "busy" and now >= worker.deadline(self.config.timeout_s):
                expired.append(worker)
            elif (
                worker.state == "busy"
                and worker.role == "ordinary"
                and now >= worker.soft_check_at
                and self.workers.overflowing() < self.config.overflow
                and self._past_soft_deadline(worker, now)
            ):
                self.workers.move_to_overflow(worker)
            elif worker.state == "starting" and now >= worker.since + STARTUP_TIMEOUT_S:
                raise GradingPoolError(
                    f"grading worker pid {worker.pid} not ready after {STARTUP_TIMEOUT_S:.0f}s"
                )
        return expired

    def _time_out(self, workers: list[Worker], now: float) -> None:
        """Record each task as timed out, then SIGKILL exactly their workers, together (the
        held-back slow tasks share one deadline); see WorkerManager.retire for when they are
        reaped."""
        for worker in workers:
            elapsed = now - worker.since
            assert worker.batch is not None  # busy
            worker.batch.outcomes[worker.task_index] = GradeOutcome(
                "timeout", None, elapsed, worker.role == "overflow"
            )
            log.info(
                "grading task %d timed out after %.1fs; killed worker pid %d",
                worker.task_index,
                elapsed,
                worker.pid,
            )
        self.workers.retire(*workers)

    def _past_soft_deadline(self, worker: Worker, now: float) -> bool:
        """Has its task used the soft deadline in CPU time (or held its slot WAIT_FACTOR times
        that)? If not, when to look again: no sooner than it could have."""
        soft_timeout_s = self.config.soft_timeout_s
        used = worker.cpu_used()
        if used >= soft_timeout_s or now >= worker.since + WAIT_FACTOR * soft_timeout_s:
            return True
        next_check = now + max(soft_timeout_s - used, CPU_TICK_S)
        worker.soft_check_at = min(next_check, worker.since + WAIT_FACTOR * soft_timeout_s)
        return False

    def _continue_overflow(self) -> None:
        """Once no ordinary task of any batch is left to grade, the held-back slow tasks run (their
        clocks resume)."""
        if any(b.pending for b in self._batches) or any(
            w.role == "ordinary" for w in self.workers.busy()
        ):
            return
        self.workers.resume_held()

    def _keep_to_budget(self, now: float, budget_bytes: int) -> None:
        """Past the memory budget, the held tasks that grew the most are killed (outcome "budget")
        until the rest fit. A task's memory is its worker's growth over its resident size when it
        was ready."""
        self._budget_check_at = now + _BUDGET_CHECK_S
        over = self.workers.over_budget(budget_bytes)
        for worker in over:
            assert worker.batch is not None  # busy
            elapsed = now - worker.since
            worker.batch.outcomes[worker.task_index] = GradeOutcome("budget", None, elapsed, True)
            log.info(
                "grading task %d killed in overflow worker pid %d: held tasks past the "
                "pool's memory budget (%d MiB)",
                worker.task_index,
                worker.pid,
                budget_bytes >> 20,
            )
        if over:
            self.workers.retire(*over)
