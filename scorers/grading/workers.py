"""The grading pool's worker manager: starts, tracks, holds back, retires and replaces worker
processes.

Why apart from the task manager: everything here is about processes (forking from the forkserver or
the template, their readiness, their memory and CPU time read from /proc, SIGSTOP/SIGCONT/SIGKILL
through their `GradingProcess`, reaping against a shared deadline), nothing about which batch wants
what. Workers start from the template when the pool has one (`warm_replay`), else from the
forkserver. Retired workers are killed at once and reaped once gone: waiting for each would hold up
the deadlines of the others (a dying worker with a large heap takes 0.1-0.3 s to exit).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing import connection as mp_connection
from typing import Any

from scorers.common.processes import describe
from scorers.grading.config import PoolConfig
from scorers.grading.errors import GradingPoolError
from scorers.grading.handles import SpawnedProcess, WorkerProcess
from scorers.grading.messages import Fatal, Ready
from scorers.grading.mp_helpers import (
    forget_pool_child,
    forkserver_modules,
    forkserver_pid,
    note_pool_child,
    preload_failure,
)
from scorers.grading.outcomes import Batch
from scorers.grading.template_owner import GradingTemplate, TemplateError, pidfds_supported
from scorers.grading.worker import ORPHANED_EXIT_CODE, worker_main

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0
REAP_TIMEOUT_S = 2.0
_FORK_TIMEOUT_S = 10.0  # the template answers between two replayed tasks
# a template reports a worker's status between two replayed tasks (<= 1 s each)
_DEATH_STATUS_WAIT_S = 2.0
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CPU_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# a worker this much above its start RSS is replaced after its task
RECYCLE_GROWTH_BYTES = 64 * 2**20

_WORKER_EXIT_MEANINGS = {
    255: "or the forkserver itself died",
    ORPHANED_EXIT_CODE: "forkserver gone before the worker started",
}


def describe_exitcode(code: int | None) -> str:
    """A worker's exit code in words (negative means killed by a signal)."""
    if code is None:
        return "exit status unknown (still running?)"
    return describe(code, _WORKER_EXIT_MEANINGS)


def usage(pid: int) -> tuple[int, float]:
    """A worker's resident bytes and CPU seconds (user + system), from /proc; (0, 0.0) once it is
    gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # after the command name, which may hold spaces
            fields = stat.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0, 0.0
    # fields[0] is the state (field 3 of proc(5)): utime, stime are fields 14, 15; rss (pages) field
    # 24
    return int(fields[21]) * _PAGE_SIZE, (int(fields[11]) + int(fields[12])) * CPU_TICK_S


@dataclass(eq=False)
class Worker:
    """Owner-side record of one worker: its process, pipe, and what it is doing."""

    process: WorkerProcess
    conn: Any
    pid: int  # cached: a reaped process no longer tells its pid
    since: float
    state: str = "starting"  # starting | idle | busy
    task_index: int = -1
    batch: Batch | None = None  # the batch its task belongs to, while busy
    # ordinary (one of the `jobs` slots) | overflow (one slow task, then retired) | spare (takes the
    # slot of the next task moved to overflow at once, instead of after a fork)
    role: str = "ordinary"
    start_rss: int = 0
    # its CPU seconds when it last became idle: a task's CPU time is counted from it
    cpu_base: float = 0.0
    # when its task's CPU time is next compared with the soft deadline
    soft_check_at: float = math.inf
    # an overflow worker held back (SIGSTOP) while ordinary tasks remain
    stopped_at: float | None = None
    stopped_s: float = 0.0  # how long its task has been held back: not counted against its timeout

    def deadline(self, timeout_s: float) -> float:
        """When its task has run for `timeout_s`; never while it is stopped."""
        return math.inf if self.stopped_at is not None else self.since + self.stopped_s + timeout_s

    def doing(self) -> str:
        if self.state == "busy":
            return f"while grading task {self.task_index}"
        return "while starting" if self.state == "starting" else "while idle"

    def cpu_used(self) -> float:
        """CPU seconds its task has used so far."""
        return usage(self.pid)[1] - self.cpu_base

    def growth(self) -> int:
        """Resident bytes it gained since it was ready (what its task allocated, or copied from the
        shared heap)."""
        return max(0, usage(self.pid)[0] - self.start_rss)


class WorkerManager:
    """Every worker of one pool (and the template they fork from); touched only by the drive lock's
    holder."""

    def __init__(self, config: PoolConfig, ctx: Any) -> None:
        self.config = config
        self._ctx = ctx
        self.workers: list[Worker] = []
        # killed; reaped when gone, at the latest by the next grade() or close()
        self.retired: list[Worker] = []
        self.template: GradingTemplate | None = None
        # the forkserver preloads the pool's modules (GradingPool.start finds out); if not, workers
        # fork from a template
        self.server_preloads = True

    # -- starting ---------------------------------------------------------------------------------

    def start(self) -> None:
        """The template (with `warm_replay`, or where the forkserver lacks the pool's preload),
        `jobs` workers and the spare, ready within the startup timeout.
        A forkserver that ended before it forked (its preload raised: a broken grader package) is
        said with what its preload raises when imported afresh, the cause that its own log alone
        would hold."""
        try:
            self._start_all()
        except (EOFError, ConnectionError) as exc:
            pid = forkserver_pid(ensure=False)
            modules = forkserver_modules(self.config.preload, self.config.grade_fn)
            raise GradingPoolError(
                f"the grading forkserver (pid {pid or '?'}) ended before it forked a worker "
                f"({type(exc).__name__}: {exc}); {preload_failure(modules, STARTUP_TIMEOUT_S)}"
            ) from exc

    def _start_all(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        if self.config.warm_replay or not self.server_preloads:
            self._start_template(deadline)
        for _ in range(self.config.jobs):
            self.spawn()
        if self.config.overflow:
            self.spawn("spare")
        while any(w.state == "starting" for w in self.workers):
            self._await_ready(deadline)

    def _await_ready(self, deadline: float) -> None:
        """Wait once for starting workers (bounded); act on their greetings and deaths."""
        watched = self.watched()
        ready = mp_connection.wait(watched, max(0.0, deadline - time.monotonic()))
        self.from_template(ready)
        for worker in list(self.workers):
            if worker.conn in ready:
                self._greeting(worker)
            elif worker.process.sentinel in ready:
                raise self.died(worker, "exited unexpectedly")
        if time.monotonic() >= deadline:
            starting = next((w for w in self.workers if w.state == "starting"), None)
            if starting is not None:
                raise GradingPoolError(
                    f"grading worker pid {starting.pid} not ready after {STARTUP_TIMEOUT_S:.0f}s"
                )

    def _greeting(self, worker: Worker) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError) as exc:
            raise self.died(worker, f"result pipe broke ({type(exc).__name__})") from exc
        if not self.greeted(worker, message):
            raise self.protocol_error(worker, message)

    def greeted(self, worker: Worker, message: object) -> bool:
        """Act on `Ready` (from a starting worker) or `Fatal`; False for any other message."""
        if isinstance(message, Ready) and worker.state == "starting":
            worker.state, worker.since = "idle", time.monotonic()
            worker.start_rss, worker.cpu_base = usage(worker.pid)
            return True
        if isinstance(message, Fatal):
            raise GradingPoolError(
                f"grading worker pid {worker.pid} cannot load {self.config.grade_fn!r}: "
                f"{message.text}"
            )
        return False

    def spawn(self, role: str = "ordinary") -> Worker:
        """Start one worker with its own duplex pipe (forked by the template if there is one, else
        by the forkserver); the owner keeps one end only."""
        process: WorkerProcess
        if self.template is not None:
            try:
                process, parent_conn = self.template.fork(time.monotonic() + _FORK_TIMEOUT_S)
            except TemplateError as exc:
                raise self.template_failed(exc.what) from exc
        else:
            process, parent_conn = self._fork_from_forkserver()
        worker = Worker(process, parent_conn, process.pid, since=time.monotonic(), role=role)
        self.workers.append(worker)
        return worker

    def _fork_from_forkserver(self) -> tuple[SpawnedProcess, Any]:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        config = self.config
        process = self._ctx.Process(
            target=worker_main,
            args=(
                child_conn,
                config.grade_fn,
                forkserver_pid(),
                config.memory_cap_bytes,
                config.cpu_limit_s,
            ),
            kwargs={"preload": config.preload},
            name="grading-worker",
            daemon=True,
        )
        try:
            process.start()
            note_pool_child(process.pid)
            return SpawnedProcess(process), parent_conn
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()  # else a dead worker's pipe would never read EOF

    # -- the template -----------------------------------------------------------------------------

    def _start_template(self, deadline: float) -> None:
        """Start the template the workers fork from and wait (bounded) until it has loaded
        grade_fn."""
        if not pidfds_supported():
            log.warning(
                "grading pool: this kernel has no pidfd_open (Linux < 5.3); workers fork "
                "from the forkserver"
            )
            return
        config = self.config
        template = GradingTemplate(
            self._ctx,
            config.grade_fn,
            forkserver_pid(),
            config.memory_cap_bytes,
            config.cpu_limit_s,
            config.preload,
        )
        note_pool_child(template.pid)
        self.template = template
        while template.state == "starting":
            ready = mp_connection.wait(
                [template.conn, template.process.sentinel], max(0.0, deadline - time.monotonic())
            )
            if not ready:
                raise self.template_failed(f"not ready after {STARTUP_TIMEOUT_S:.0f}s")
            self.from_template(ready)

    def from_template(self, ready: list[Any]) -> None:
        """Act on the template's messages and on its death, if they are among `ready`."""
        template = self.template
        if template is None:
            return
        try:
            if template.conn in ready:
                template.receive()
        except TemplateError as exc:
            raise self.template_failed(exc.what) from exc
        if template.process.sentinel in ready or template.state == "gone":
            raise self.template_failed("exited unexpectedly (its workers die with it)")

    def template_failed(self, what: str) -> GradingPoolError:
        template = self.template
        assert template is not None
        if template.state == "gone" or not template.process.is_alive():
            # it is exiting: its status is moments away
            template.process.wait_status(_DEATH_STATUS_WAIT_S)
        return GradingPoolError(
            f"grading template pid {template.pid} {what}: "
            f"{describe_exitcode(template.process.exitcode)}"
        )

    def between_batches(self) -> None:
        """Read what the template reported while we were idle; replace it if a replay left it
        tainted; then halt its replay: the cores are the batch's."""
        template = self.template
        if template is None:
            return
        try:
            template.drain()
        except TemplateError as exc:
            raise self.template_failed(exc.what) from exc
        self.from_template(mp_connection.wait([template.process.sentinel], 0))
        if template.tainted:
            self.kill_all()  # all idle, all forked from the tainted template
            self.close_template()
            self.start()
        else:
            template.halt()

    def warm(self, sample: list[tuple]) -> None:
        """Have the template replay `sample` while the pool is idle."""
        if self.template is not None:
            self.template.warm(sample)

    def settle_template(self, timeout_s: float) -> bool:
        """Wait (bounded) until the template has replayed the last batch; True if it has (or there
        is none)."""
        if self.template is None:
            return True
        try:
            return (
                self.template.settle(time.monotonic() + timeout_s) and self.template.state != "gone"
            )
        except TemplateError as exc:
            raise self.template_failed(exc.what) from exc

    def close_template(self) -> None:
        template, self.template = self.template, None
        if template is not None:
            template.close(REAP_TIMEOUT_S)
            forget_pool_child(template.pid)

    # -- tracking ---------------------------------------------------------------------------------

    def watched(self) -> list[Any]:
        """Every pipe and sentinel to wait on: the workers', then the template's."""
        objects: list[Any] = []
        for worker in self.workers:
            objects += [worker.conn, worker.process.sentinel]
        if self.template is not None:
            objects += [self.template.conn, self.template.process.sentinel]
        return objects

    def idle_ordinary(self) -> list[Worker]:
        return [w for w in self.workers if w.state == "idle" and w.role == "ordinary"]

    def busy(self) -> list[Worker]:
        return [w for w in self.workers if w.state == "busy"]

    def held(self) -> Iterator[Worker]:
        """Tasks moved to overflow workers, running or stopped: they keep their memory either
        way."""
        return (w for w in self.workers if w.role == "overflow" and w.state == "busy")

    def overflowing(self) -> int:
        return sum(worker.role == "overflow" for worker in self.workers)

    def died(self, worker: Worker, what: str) -> GradingPoolError:
        """Build the error for a worker that failed on its own; wait briefly for its exit status."""
        code = worker.process.wait_status(_DEATH_STATUS_WAIT_S)
        return GradingPoolError(
            f"grading worker pid {worker.pid} {what} {worker.doing()}: {describe_exitcode(code)}"
        )

    def exit_status(self, worker: Worker) -> int | None:
        """Its exit status, waited for briefly (it exited, or is exiting)."""
        return worker.process.wait_status(_DEATH_STATUS_WAIT_S)

    @staticmethod
    def protocol_error(worker: Worker, message: object) -> GradingPoolError:
        return GradingPoolError(
            f"grading worker pid {worker.pid} sent {type(message).__name__} {worker.doing()} "
            f"(protocol error)"
        )

    def over_budget(self, budget_bytes: int) -> list[Worker]:
        """The held tasks that grew the most, until the rest fit in `budget_bytes`. Read from
        /proc/PID/stat in constant time (smaps would walk every page, 8 times every 50 ms). Stopped
        ones count: they keep their memory."""
        held = list(self.held())
        sizes = {worker: worker.growth() for worker in held}
        total, over = sum(sizes.values()), []
        for worker in sorted(held, key=lambda w: sizes[w], reverse=True):
            if total <= budget_bytes:
                break
            over.append(worker)
            total -= sizes[worker]
        return over

    # -- holding back, retiring, replacing ---------------------------------------------------------

    def move_to_overflow(self, worker: Worker) -> None:
        """The slow task leaves the `jobs` slots, held back (SIGSTOP); the spare takes its slot
        now."""
        worker.role = "overflow"
        worker.process.signal(signal.SIGSTOP)
        worker.stopped_at = time.monotonic()
        log.info(
            "grading task %d passed the soft deadline: held in overflow worker pid %d",
            worker.task_index,
            worker.pid,
        )
        spare = next((w for w in self.workers if w.role == "spare"), None)
        if spare is None:
            self.spawn()
            return
        spare.role = "ordinary"  # the slot is served now; the next spare forks meanwhile
        self.spawn("spare")

    def resume_held(self) -> None:
        """The held-back slow tasks run again (SIGCONT); their clocks resume."""
        now = time.monotonic()
        for worker in self.workers:
            if worker.stopped_at is not None:
                worker.stopped_s += now - worker.stopped_at
                worker.stopped_at = None
                worker.process.signal(signal.SIGCONT)

    def retire(self, *workers: Worker) -> None:
        """SIGKILL workers done with (or past) their tasks; an ordinary one is replaced. They are
        reaped later, together (see the module docstring)."""
        for worker in workers:
            self.workers.remove(worker)
        _kill(workers)
        self.retired.extend(workers)
        for worker in workers:
            if worker.role == "ordinary":
                self.spawn()

    def reap_retired(self, also: Sequence[Worker] = (), wait: bool = True) -> None:
        """Reap the retired workers (and `also`, already killed) against one shared deadline;
        without `wait`, only those already gone (the others stay retired, to be reaped later)."""
        budget_s = REAP_TIMEOUT_S if wait else 0.0
        deadline = time.monotonic() + budget_s
        running = []
        for worker in [*self.retired, *also]:
            if worker.process.reap(max(0.0, deadline - time.monotonic())):
                forget_pool_child(worker.pid)
                continue
            running.append(worker)
            if budget_s:
                log.warning(
                    "grading worker pid %d alive %.1fs after SIGKILL; leaving it",
                    worker.pid,
                    budget_s,
                )
        self.retired = running

    def kill_all(self) -> None:
        """SIGKILL every worker and reap them (and the retired ones) against one bounded
        deadline."""
        workers, self.workers = self.workers, []
        _kill(workers)
        self.reap_retired(workers)


def _kill(workers: Sequence[Worker]) -> None:
    """SIGKILL each worker that is not yet known to be gone, and close our end of its pipe."""
    for worker in workers:
        worker.conn.close()
        worker.process.kill()
